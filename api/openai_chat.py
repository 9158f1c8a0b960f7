"""OpenAI Chat Completions body -> Call (GenerationRequest + OpenAIChatProjector). 400s name the field."""
from api import intake, served as served_mod, tools as tools_mod
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
}


def parse(body, *, served):
    model = served_mod.model_check(served, intake.model_name(body))
    messages = tools_mod.chat_messages(body, roles=ROLES | {"function"}, text_types=("text", "input_text"),
                                       rename={"developer": "system"})
    stream = intake.field_bool(body, "stream")
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, REFUSED)
    plan = tools_mod.chat_plan(body)
    intake.refuse_format(body.get("response_format"), "response_format")
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, "stop", limit=4)
    budget = intake.budget(body, ("max_completion_tokens", "max_tokens"))
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(
        prompt=served_mod.render(served, messages, plan.tools if plan.active else ()), max_tokens=intake.engine_budget(budget, served),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        priority="interactive", topk=ext.topk, experts=ext.experts, routes=ext.routing,
    )
    tools_mod.constrain(plan, request, served)
    projector = OpenAIChatProjector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=budget == 0, stop=stop, routing=ext.routing, tools=plan,
                                    calls=plan.parser(served, new_id=tools_mod.new_id("call_")))
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param="messages")
