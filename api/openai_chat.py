"""OpenAI Chat Completions body -> Call (GenerationRequest + OpenAIChatProjector). 400s name the field."""
from api import intake, served as served_mod
from api.errors import bad_param
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


def _messages(body):
    if "messages" not in body:
        raise bad_param("messages", "missing messages")
    msgs = body["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise bad_param("messages", "messages must be a non-empty array")
    out = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict):
            raise bad_param(f"messages[{i}]", f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_param(f"messages[{i}].role", f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}")
        content = intake.text_parts(msg.get("content"), f"messages[{i}].content", text_types=("text", "input_text"))
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse(body, *, served):
    model = served_mod.model_check(served, intake.model_name(body))
    messages = _messages(body)
    stream = intake.field_bool(body, "stream")
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, REFUSED)
    intake.refuse_tool_choice(body.get("tool_choice"))
    intake.refuse_format(body.get("response_format"), "response_format")
    temperature, top_p, seed = intake.sampling(body, served=served)
    stop = intake.stop_list(body, "stop", limit=4)
    budget = intake.budget(body, ("max_completion_tokens", "max_tokens"))
    experts, topk = intake.colibri_extension(body, served=served)
    request = GenerationRequest(
        prompt=served_mod.render(served, messages), max_tokens=intake.engine_budget(budget, served),
        temperature=temperature, top_p=top_p, stop=stop, seed=seed,
        conversation_key=None,  # stateless: the bridge picks a slot by prompt prefix
        priority="interactive", topk=topk, experts=experts,
    )
    projector = OpenAIChatProjector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=budget == 0, stop=stop)
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param="messages")
