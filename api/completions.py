"""Legacy Completions body -> Call. The prompt goes to the engine raw (no chat template), so there is
no template to render tools into: `tools` / `functions` are refused (its row in api.surfaces), as
is a tool_choice that needs tools; nor is the output split into reasoning (the text comes back as
the model wrote it)."""
from typing import TYPE_CHECKING

from api import intake, served as served_mod
from api.errors import bad_param
from api.projectors import Choices
from engine_bridge.served import ServedModel

if TYPE_CHECKING:
    from api.surfaces import Surface

def _prompt(body: intake.Body) -> str:
    if "prompt" not in body or body["prompt"] is None:
        raise bad_param("prompt", "missing prompt")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad_param("prompt", "prompt must be a non-empty string (or an array of exactly one)")
    return prompt


def parse(body: intake.Body, *, served: ServedModel | None, surface: "Surface") -> intake.Call:
    model = served_mod.model_check(served, intake.model_name(body))
    assert served is not None  # model_check refuses a model no bridge serves
    prompt = _prompt(body)
    opts = intake.field_object(body, "stream_options")
    intake.refuse(body, surface.refused)
    intake.refuse_tool_choice(body.get("tool_choice"))
    intake.refuse_format(body.get("response_format"), "response_format")
    common = intake.common(body, served=served, surface=surface, raw_prompt=True)
    n = intake.choices_count(body)
    logprobs = intake.completion_logprobs(body, served=served)
    request = common.request(prompt=prompt, model=model, served=served, logprobs=logprobs)
    projectors = [surface.projector(model=model, include_usage=bool(opts.get("include_usage")),
                                    discard_text=common.budget == 0, stop=common.stop, routing=common.ext.routing,
                                    logprobs=logprobs)
                  for _ in range(n)]
    return intake.Call(request=request, projector=projectors[0] if n == 1 else Choices(projectors),
                       stream=common.stream, prompt_param=surface.prompt_param,
                       requests=intake.choice_requests(request, n))
