"""Anthropic Messages body -> Call. `max_tokens` is optional (DS4; the SDK always sends it).
Also the prompt of POST /v1/messages/count_tokens (count_prompt): the same rendering, so a count
is the count of what a create with the same fields would submit."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod, tools as tools_mod
from engine_bridge.client import GenerationRequest
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import Surface

def _system(body: intake.Body) -> str:
    system = body.get("system")
    if system is None:
        return ""
    return intake.text_parts(system, "system")


def count_prompt(body: intake.Body, *, served: ServedModel | None) -> tuple[str, str]:
    """(model id to echo, the rendered prompt) of a count_tokens body: system + tools + messages,
    the tools rendered as a create offers them (the served model's tool syntax, api.tools)."""
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    plan = tools_mod.anthropic_plan(body)
    return model, _render(served, _system(body), tools_mod.anthropic_messages(body), plan)


def _render(served: ServedModel, system: str, messages: list[dict], plan: tools_mod.ToolPlan) -> str:
    return served_mod.render(served, ([{"role": "system", "content": system}] if system else []) + messages,
                             plan.tools if plan.active else ())


def _refuse_formats(body: intake.Body) -> None:
    intake.refuse_format(body.get("output_format"), "output_format")
    config = intake.field_object(body, "output_config")
    intake.refuse_format(config.get("format"), "output_config.format")


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    system = _system(body)
    messages = tools_mod.anthropic_messages(body)
    stream = intake.field_bool(body, "stream")
    intake.refuse(body, surface.refused)
    plan = tools_mod.anthropic_plan(body)
    _refuse_formats(body)
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, surface.stop)
    budget = intake.budget(body, surface.budget)
    prompt = _render(served, system, messages, plan)
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(prompt=prompt, max_tokens=intake.engine_budget(budget, served), model=model,
                                temperature=temperature, top_p=top_p, stop=stop, seed=seed, experts=ext.experts,
                                routes=ext.routing, top_k=intake.top_k(body, served=served))
    tools_mod.constrain(plan, request, served)
    projector = surface.projector(model=model, discard_text=budget == 0, stop=stop, routing=ext.routing, tools=plan,
                                  calls=plan.parser(served, new_id=tools_mod.new_id("toolu_")))
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param=surface.prompt_param)
