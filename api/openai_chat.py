"""OpenAI Chat Completions body -> Call (GenerationRequest + its row's projector). 400s name the field.
What every surface shares (refused fields, stop and budget fields) is in its row, api.surfaces,
and read by the one intake step (api.intake.common)."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod, structured, tools as tools_mod
from api.projectors import Choices
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import Surface

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    """`surface`: this surface's row (api.surfaces)."""
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    messages = tools_mod.chat_messages(body, roles=ROLES, text_types=("text", "input_text"), rename={"developer": "system"})
    opts = intake.field_object(body, "stream_options")
    common = intake.common(body, served=served, surface=surface)
    plan = tools_mod.chat_plan(body)
    grammar = structured.grammar_for(body.get("response_format"), "response_format", served=served)
    n = intake.choices_count(body)
    logprobs = intake.chat_logprobs(body, served=served)
    prompt = served_mod.prompt_for(served, messages, plan, common.thinking, structured=grammar is not None)
    request = common.request(prompt=prompt, model=model, served=served, grammar=grammar, logprobs=logprobs)
    tools_mod.constrain(plan, request, served)
    projectors = [surface.projector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=common.budget == 0, stop=common.stop, routing=common.ext.routing,
                                    logprobs=logprobs, tools=plan, reasoning=common.thinking.mode,
                                    calls=plan.parser(served, new_id=tools_mod.new_id("call_")))
                  for _ in range(n)]  # each choice parses its own calls
    return intake.Call(request=request, projector=projectors[0] if n == 1 else Choices(projectors),
                       stream=common.stream, prompt_param=surface.prompt_param,
                       requests=intake.choice_requests(request, n))
