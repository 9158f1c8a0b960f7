"""Anthropic Messages body -> Call. `max_tokens` is optional (DS4; the SDK always sends it)."""
from api import intake, served as served_mod
from engine_bridge.client import GenerationRequest

ROLES = {"user", "assistant"}


def _system(body):
    system = body.get("system")
    if system is None:
        return ""
    return intake.text_parts(system, "system")


def _refuse_formats(body):
    intake.refuse_format(body.get("output_format"), "output_format")
    config = intake.field_object(body, "output_config")
    intake.refuse_format(config.get("format"), "output_config.format")


def parse(body, *, served, surface):
    model = served_mod.model_check(served, intake.model_name(body))
    system = _system(body)
    messages = intake.message_list(body, roles=ROLES)
    stream = intake.field_bool(body, "stream")
    intake.refuse(body, surface.refused)
    intake.refuse_tool_choice(body.get("tool_choice"))
    _refuse_formats(body)
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, surface.stop)
    budget = intake.budget(body, surface.budget)
    prompt = served_mod.render(served, ([{"role": "system", "content": system}] if system else []) + messages)
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(prompt=prompt, max_tokens=intake.engine_budget(budget, served),
                                temperature=temperature, top_p=top_p, stop=stop, seed=seed, experts=ext.experts,
                                routes=ext.routing, top_k=intake.top_k(body, served=served))
    projector = surface.projector(model=model, discard_text=budget == 0, stop=stop, routing=ext.routing)
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param=surface.prompt_param)
