"""OpenAI Chat Completions body -> Call (GenerationRequest + OpenAIChatProjector). 400s name the field."""
from api import intake, served as served_mod, structured
from api.projectors import OpenAIChatProjector
from engine_bridge.client import GenerationRequest

ROLES = {"system", "developer", "user", "assistant", "tool"}
# Parameters the engine cannot honour: refused, never silently changed (api-surfaces §1.6).
REFUSED = {
    "n": lambda v: v not in (None, 1),
    "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v is not None,
    "logit_bias": lambda v: bool(v),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "top_k": lambda v: v is not None,
    "tools": lambda v: bool(v),
}


def parse(body, *, served):
    model = served_mod.model_check(served, intake.model_name(body))
    messages = intake.message_list(body, roles=ROLES, text_types=("text", "input_text"), rename={"developer": "system"})
    stream = intake.field_bool(body, "stream")
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, REFUSED)
    intake.refuse_tool_choice(body.get("tool_choice"))
    grammar = structured.grammar_for(body.get("response_format"), "response_format", served=served)
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, "stop", limit=4)
    budget = intake.budget(body, ("max_completion_tokens", "max_tokens"))
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(
        prompt=served_mod.render(served, messages), max_tokens=intake.engine_budget(budget, served),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        priority="interactive", topk=ext.topk, experts=ext.experts, routes=ext.routing, grammar=grammar,
    )
    projector = OpenAIChatProjector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=budget == 0, stop=stop, routing=ext.routing)
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param="messages")
