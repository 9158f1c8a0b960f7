"""OpenAI Chat Completions body -> Call (GenerationRequest + its row's projector). 400s name the field.
What every surface shares (refused fields, stop and budget fields) is in its row, api.surfaces."""
from api import intake, served as served_mod
from api.projectors import Choices
from engine_bridge.client import GenerationRequest

ROLES = {"system", "developer", "user", "assistant", "tool"}
def parse(body, *, served, surface):
    """`surface`: this surface's row (api.surfaces)."""
    model = served_mod.model_check(served, intake.model_name(body))
    messages = intake.message_list(body, roles=ROLES, text_types=("text", "input_text"), rename={"developer": "system"})
    stream = intake.field_bool(body, "stream")
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, surface.refused)
    intake.refuse_tool_choice(body.get("tool_choice"))
    intake.refuse_format(body.get("response_format"), "response_format")
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, surface.stop)
    budget = intake.budget(body, surface.budget)
    ext = intake.colibri_extension(body, served=served)
    n = intake.choices_count(body)
    logprobs = intake.chat_logprobs(body, served=served)
    request = GenerationRequest(
        prompt=served_mod.render(served, messages), max_tokens=intake.engine_budget(budget, served),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        priority="interactive", topk=ext.topk, experts=ext.experts, routes=ext.routing,
        top_k=intake.top_k(body, served=served), logprobs=intake.engine_logprobs(logprobs),
    )
    projectors = [surface.projector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=budget == 0, stop=stop, routing=ext.routing, logprobs=logprobs)
                  for _ in range(n)]
    return intake.Call(request=request, projector=projectors[0] if n == 1 else Choices(projectors), stream=stream,
                       prompt_param=surface.prompt_param, requests=intake.choice_requests(request, n))
