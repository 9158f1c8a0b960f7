"""The served models as the /v1 surfaces see them: the facts come from the one reader,
engine_bridge.served (ServedModel, one per model the live bridges serve); here only what is the
API's own: which model a request names (model_of), the model check of a request (404 / 503),
the template rendering with a 400 naming the field, the list entries.

Invariant: an unknown model name is 404 only while every live bridge's engine is up; while one
is starting, restarting or none is running it is 503 + Retry-After (never 404 model_not_found just
because a MODEL line has not arrived yet: that bridge may be the one serving the name). A known
name always goes on to the bridge, which is the authority on whether the engine can take it (it
answers ENGINE_UNAVAILABLE at once otherwise, also a 503): a late telemetry heartbeat must not
turn a servable request away. The model a request names selects everything model-specific of
it: the template, the context length, the extensions, and the bridge (GenerationRequest.model).
"""
import time
from typing import TYPE_CHECKING

from api.errors import ApiError, unavailable
from engine_bridge.served import (ServedModel, aserved_model_get, aserved_models_get,  # noqa: F401
                                  served_model_from, served_model_get, served_models_get)

STARTED = int(time.time())
if TYPE_CHECKING:
    from api.intake import Thinking
    from api.tools import ToolPlan

RETRY_AFTER_S = 2  # a restart costs seconds; the SDKs honour Retry-After


def model_of(body: object, name: str = "model") -> str | None:
    """The model a request body names, for choosing its ServedModel before the parse; None when
    it names none usable (the parse then refuses the field itself, in the surface's envelope)."""
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, str) else None


def model_check(served: ServedModel | None, name: str) -> str:
    """The id to echo back for `name` (served: what engine_bridge.served picked for it), or 503
    (no engine ready that might serve it) / 404 model_not_found naming the ids served."""
    if served is not None and name in served.aliases:
        return served.id
    if served is not None:  # the facts of the one bridge there is (or was): it does not serve `name`
        if not served.up:
            raise unavailable(retry_after=RETRY_AFTER_S)
        ids = [served.id]
    else:  # live bridges run, none serving `name`
        models = served_models_get()
        if not models or not all(m.up for m in models):
            raise unavailable(retry_after=RETRY_AFTER_S)  # a bridge still starting may serve it
        ids = [m.id for m in models]
    raise ApiError(404, f"The model {name!r} does not exist; this server serves "
                   f"{', '.join(repr(i) for i in ids)} (GET /v1/models)", param="model", code="model_not_found")


def render(served: ServedModel, messages: list[dict], tools: tuple | list = (), *,
           thinking: "Thinking | None" = None, prefill: str = "") -> str:
    """Neutral messages (and the tools to offer) -> the prompt, in the served model's template and
    tool syntax (engine_bridge.toolsyntax), with the request's reasoning wishes (api.intake.Thinking)."""
    from engine_bridge import toolsyntax
    from engine_bridge.prompting import TemplateError

    from api.errors import bad_param

    try:
        return toolsyntax.render(messages, tools, served, thinking=thinking.enabled if thinking else None,
                                 effort=thinking.effort if thinking else None, prefill=prefill)
    except TemplateError as exc:
        raise bad_param("messages", str(exc))


def prompt_for(served: ServedModel, messages: list[dict], plan: "ToolPlan", thinking: "Thinking", *,
               structured: bool = False) -> str:
    """The prompt of a templated surface. Output a grammar holds (a forced tool choice, a
    response format) cannot start with thinking markup the grammar does not know: a `<think>`
    model is asked for no thinking, a harmony prompt ends in the header of the one message the
    output is (engine_bridge.harmony.constrained_header)."""
    from dataclasses import replace

    from engine_bridge import harmony

    forced = plan.active and plan.choice in ("required", "named")
    prefill = ""
    if forced or structured:
        if thinking.mode == "harmony":
            prefill = harmony.constrained_header(tool=plan.name if forced and plan.named else None,
                                                 calls=forced and plan.choice == "required")
        elif thinking.mode == "think":
            thinking = replace(thinking, enabled=False)
    return render(served, messages, plan.tools if plan.active else (), thinking=thinking, prefill=prefill)


def openai_entry(m: ServedModel) -> dict:
    return {"id": m.id, "object": "model", "created": STARTED, "owned_by": "colibri",
            "display_name": m.display_name, "context_length": m.context_length,
            "max_model_len": m.context_length, "status": m.status, "bridges": list(m.bridges)}


def anthropic_entry(m: ServedModel) -> dict:
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(STARTED))
    return {"type": "model", "id": m.id, "display_name": m.display_name, "created_at": created,
            "context_length": m.context_length}


def listed(models: list[ServedModel], default: ServedModel | None) -> list[dict]:
    """/v1/models' items, both styles in one: every model a live bridge serves, sorted by id; with
    no live bridge, the configured default model (down: its requests answer 503, and an SDK can
    still learn the id to type)."""
    shown = models or ([default] if default is not None else [])
    return [{**openai_entry(m), **anthropic_entry(m)} for m in shown]
