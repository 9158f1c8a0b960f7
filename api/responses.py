"""OpenAI Responses body -> Call. A stateless subset: durable references are refused (clients
replay the full input), tools are refused, structured output (text.format) is api/structured's,
`store` is ignored."""
from api import intake, served as served_mod, structured
from api.errors import bad_param
from api.projectors import ResponsesProjector
from engine_bridge.client import GenerationRequest

ROLES = {"user", "system", "developer", "assistant"}
REFUSED = {
    "tools": lambda v: bool(v),
    "top_logprobs": lambda v: v not in (None, 0),
    "top_k": lambda v: v is not None,
}
TEXT_TYPES = ("input_text", "output_text", "text")


def _durable(body):
    for name in ("previous_response_id", "conversation"):
        if body.get(name) is not None:
            raise bad_param(name, f"{name} is not supported; replay full input instead")


def _input(body):
    if "input" not in body or body["input"] is None:
        raise bad_param("input", "missing input")
    items = body["input"]
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_param("input", "input must be a string or a non-empty array of messages")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_param(f"input[{i}]", f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind != "message":
            raise bad_param(f"input[{i}].type", f"input item type {str(kind)[:40]!r} is not supported by this server")
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_param(f"input[{i}].role", f"input[{i}].role must be one of {', '.join(sorted(ROLES))}")
        content = intake.text_parts(item.get("content"), f"input[{i}].content", text_types=TEXT_TYPES)
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse(body, *, served):
    model = served_mod.model_check(served, intake.model_name(body))
    _durable(body)
    messages = _input(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_param("instructions", "instructions must be a string")
    stream = intake.field_bool(body, "stream")
    intake.refuse(body, REFUSED)
    intake.refuse_tool_choice(body.get("tool_choice"))
    text_format = intake.field_object(body, "text").get("format")
    grammar = structured.grammar_for(text_format, "text.format", served=served, flat=True)
    temperature, top_p, seed = intake.sampling(body, served=served)
    budget = intake.budget(body, ("max_output_tokens",))
    prompt = served_mod.render(served, ([{"role": "system", "content": instructions}] if instructions else []) + messages)
    ext = intake.colibri_extension(body, served=served)
    request = GenerationRequest(prompt=prompt, max_tokens=intake.engine_budget(budget, served),
                                temperature=temperature, top_p=top_p, seed=seed, experts=ext.experts,
                                routes=ext.routing, grammar=grammar)
    echo = {"instructions": instructions, "temperature": temperature, "top_p": top_p, "max_output_tokens": budget,
            **({"text": {"format": text_format}} if grammar is not None else {})}
    projector = ResponsesProjector(model=model, discard_text=budget == 0, echo=echo, routing=ext.routing)
    return intake.Call(request=request, projector=projector, stream=stream, prompt_param="input")
