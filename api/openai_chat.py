"""OpenAI Chat Completions body -> Call (GenerationRequest + its row's projector). 400s name the field.
What every surface shares (refused fields, stop and budget fields) is in its row, api.surfaces."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod, structured, tools as tools_mod
from api.projectors import Choices
from engine_bridge.client import GenerationRequest
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import Surface

ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    """`surface`: this surface's row (api.surfaces)."""
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    messages = tools_mod.chat_messages(body, roles=ROLES, text_types=("text", "input_text"), rename={"developer": "system"})
    stream = intake.field_bool(body, "stream")
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, surface.refused)
    plan = tools_mod.chat_plan(body)
    grammar = structured.grammar_for(body.get("response_format"), "response_format", served=served)
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, surface.stop)
    budget = intake.budget(body, surface.budget)
    ext = intake.colibri_extension(body, served=served)
    n = intake.choices_count(body)
    logprobs = intake.chat_logprobs(body, served=served)
    request = GenerationRequest(
        prompt=served_mod.render(served, messages, plan.tools if plan.active else ()), max_tokens=intake.engine_budget(budget, served),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        model=model,  # the bridge serving it (engine_bridge routing)
        priority="interactive", topk=ext.topk, experts=ext.experts, routes=ext.routing,
        top_k=intake.top_k(body, served=served), logprobs=intake.engine_logprobs(logprobs), grammar=grammar,
    )
    tools_mod.constrain(plan, request, served)
    projectors = [surface.projector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=budget == 0, stop=stop, routing=ext.routing, logprobs=logprobs,
                                    tools=plan, calls=plan.parser(served, new_id=tools_mod.new_id("call_")))
                  for _ in range(n)]  # each choice parses its own calls
    return intake.Call(request=request, projector=projectors[0] if n == 1 else Choices(projectors), stream=stream,
                       prompt_param=surface.prompt_param, requests=intake.choice_requests(request, n))
