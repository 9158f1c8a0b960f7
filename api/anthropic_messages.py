"""Anthropic Messages body -> Call. `max_tokens` is optional (DS4; the SDK always sends it).
Also the prompt of POST /v1/messages/count_tokens (count_prompt): the same rendering, so a count
is the count of what a create with the same fields would submit."""
import json

from api import intake, served as served_mod
from api.errors import bad_param
from engine_bridge.client import GenerationRequest

ROLES = {"user", "assistant"}


def _system(body):
    system = body.get("system")
    if system is None:
        return ""
    return intake.text_parts(system, "system")


def _tools_text(body):
    """count_tokens' tools in a generic JSON form (one line per tool, after the system text),
    until the template renders tools itself (issue 25 item 2): a count that includes them,
    close to what such a rendering costs. Each tool must be an object with a string name."""
    tools = body.get("tools")
    if tools is None:
        return ""
    if not isinstance(tools, list):
        raise bad_param("tools", "tools must be an array")
    lines = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_param(f"tools[{i}].name", f"tools[{i}] must be an object with a non-empty string name")
        spec = {k: tool[k] for k in ("name", "description", "input_schema") if k in tool}
        lines.append(json.dumps(spec, ensure_ascii=False, separators=(",", ":")))
    return "# Tools\n\n" + "\n".join(lines) if lines else ""


def count_prompt(body, *, served):
    """(model id to echo, the rendered prompt) of a count_tokens body: system + tools + messages."""
    model = served_mod.model_check(served, intake.model_name(body))
    system = "\n\n".join(t for t in (_system(body), _tools_text(body)) if t)
    messages = intake.message_list(body, roles=ROLES)
    return model, _render(served, system, messages)


def _render(served, system, messages):
    return served_mod.render(served, ([{"role": "system", "content": system}] if system else []) + messages)


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
    prompt = _render(served, system, messages)
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(prompt=prompt, max_tokens=intake.engine_budget(budget, served),
                                temperature=temperature, top_p=top_p, stop=stop, seed=seed, experts=ext.experts,
                                routes=ext.routing, top_k=intake.top_k(body, served=served))
    projector = surface.projector(model=model, discard_text=budget == 0, stop=stop, routing=ext.routing)
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param=surface.prompt_param)
