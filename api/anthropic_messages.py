"""Anthropic Messages body -> Call. `max_tokens` is optional (DS4; the SDK always sends it).
Also the prompt of POST /v1/messages/count_tokens (count_prompt): the same rendering, so a count
is the count of what a create with the same fields would submit. Structured output
(`output_format`, or `output_config.format`: {type: json_schema, schema}) is held to the same
grammar as Chat's response_format (api.structured)."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod, structured, tools as tools_mod
from api.errors import bad_param
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
    thinking = intake.thinking(body, "anthropic_messages", served)
    return model, _render(served, _system(body), tools_mod.anthropic_messages(body), plan, thinking,
                          structured=_output_format(body)[0] is not None)


def _render(served: ServedModel, system: str, messages: list[dict], plan: tools_mod.ToolPlan,
            thinking: intake.Thinking, *, structured: bool = False) -> str:
    return served_mod.prompt_for(served, ([{"role": "system", "content": system}] if system else []) + messages,
                                 plan, thinking, structured=structured)


def _output_format(body: intake.Body) -> tuple[object, str]:
    """(the structured-output format, the field it came in): `output_format` (beta spelling) or
    `output_config.format`; both at once is ambiguous and refused."""
    config = intake.field_object(body, "output_config")
    legacy, current = body.get("output_format"), config.get("format")
    if legacy is not None and current is not None:
        raise bad_param("output_format", "send output_format or output_config.format, not both")
    return (legacy, "output_format") if legacy is not None else (current, "output_config.format")


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    system = _system(body)
    messages = tools_mod.anthropic_messages(body)
    common = intake.common(body, served=served, surface=surface)
    plan = tools_mod.anthropic_plan(body)
    value, name = _output_format(body)
    grammar = structured.grammar_for(value, name, served=served, flat=True)
    prompt = _render(served, system, messages, plan, common.thinking, structured=grammar is not None)
    request = common.request(prompt=prompt, model=model, served=served, grammar=grammar)
    tools_mod.constrain(plan, request, served)
    projector = surface.projector(model=model, discard_text=common.budget == 0, stop=common.stop,
                                  routing=common.ext.routing, tools=plan, reasoning=common.thinking.mode,
                                  calls=plan.parser(served, new_id=tools_mod.new_id("toolu_")))
    return intake.Call(request=request, projector=projector, stream=common.stream, prompt_param=surface.prompt_param)
