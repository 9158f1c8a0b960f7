"""OpenAI Responses body -> Call. A stateless subset: durable references are refused (clients
replay the full input, function_call / function_call_output and reasoning items included),
structured output (text.format) is api/structured's, `store` is ignored. Function tools only
(api.tools)."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod, structured, tools as tools_mod
from api.errors import bad_param
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import Surface

ROLES = {"user", "system", "developer", "assistant"}
TEXT_TYPES = ("input_text", "output_text", "text")


def _durable(body: intake.Body) -> None:
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise bad_param(name, f"{name} is not supported; replay full input instead")


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    _durable(body)
    messages = tools_mod.responses_items(body, roles=ROLES, text_types=TEXT_TYPES)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_param("instructions", "instructions must be a string")
    common = intake.common(body, served=served, surface=surface)
    plan = tools_mod.responses_plan(body)
    text_format = intake.field_object(body, "text").get("format")
    grammar = structured.grammar_for(text_format, "text.format", served=served, flat=True)
    system = [{"role": "system", "content": instructions}] if instructions else []
    prompt = served_mod.prompt_for(served, system + messages, plan, common.thinking, structured=grammar is not None)
    request = common.request(prompt=prompt, model=model, served=served, grammar=grammar)
    tools_mod.constrain(plan, request, served)
    echo = {"instructions": instructions, "temperature": common.temperature, "top_p": common.top_p,
            "max_output_tokens": common.budget, "tools": tools_mod.responses_tools_echo(plan), "tool_choice": plan.echo,
            "parallel_tool_calls": plan.parallel,
            **({"text": {"format": text_format}} if grammar is not None else {}),
            **({"reasoning": {"effort": common.thinking.effort, "summary": None}} if common.thinking.mode else {})}
    projector = surface.projector(model=model, discard_text=common.budget == 0, echo=echo, routing=common.ext.routing,
                                  tools=plan, reasoning=common.thinking.mode,
                                  calls=plan.parser(served, new_id=tools_mod.new_id("call_")))
    return intake.Call(request=request, projector=projector, stream=common.stream, prompt_param=surface.prompt_param)
