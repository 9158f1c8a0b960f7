"""The served model as the /v1 surfaces see it: the facts come from the one reader,
engine_bridge.served (ServedModel); here only what is the API's own: the model check of a
request (404 / 503), the template rendering with a 400 naming the field, the list entries.

Invariant: an unknown model name is 404 only while the engine is up; while it is starting,
restarting or down it is 503 + Retry-After (never 404 model_not_found just because the MODEL line
has not arrived yet). A known name always goes on to the bridge, which is the authority on
whether the engine can take it (it answers ENGINE_UNAVAILABLE at once otherwise, also a 503):
a late telemetry heartbeat must not turn a servable request away.
"""
import time

from api.errors import ApiError, unavailable
from engine_bridge.served import ServedModel, aserved_model_get, served_model_from, served_model_get  # noqa: F401

STARTED = int(time.time())
RETRY_AFTER_S = 2  # a restart costs seconds; the SDKs honour Retry-After


def model_check(served, name):
    """The id to echo back for `name`, or 503 (engine not ready) / 404 (unknown model)."""
    if name in served.aliases:
        return served.id
    if not served.up:
        raise unavailable(retry_after=RETRY_AFTER_S)
    raise ApiError(404, f"The model {name!r} does not exist; this server serves {served.id!r}",
                   param="model", code="model_not_found")


def render(served, messages, tools=()):
    """Neutral messages (and the tools to offer) -> the prompt, in the served model's template and
    tool syntax (engine_bridge.toolsyntax)."""
    from engine_bridge import toolsyntax
    from engine_bridge.prompting import TemplateError

    from api.errors import bad_param

    try:
        return toolsyntax.render(messages, tools, served)
    except TemplateError as exc:
        raise bad_param("messages", str(exc))


def openai_entry(m):
    return {"id": m.id, "object": "model", "created": STARTED, "owned_by": "colibri",
            "display_name": m.display_name, "context_length": m.context_length,
            "max_model_len": m.context_length}


def anthropic_entry(m):
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(STARTED))
    return {"type": "model", "id": m.id, "display_name": m.display_name, "created_at": created,
            "context_length": m.context_length}
