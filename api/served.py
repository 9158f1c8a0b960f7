"""What model the site serves, for /v1/models and the `model` check."""
import time
from pathlib import Path

from django.conf import settings

STARTED = int(time.time())
ALIASES = ("colibri", "default")


def _model_json():
    try:
        from engine_bridge import telemetry

        return (telemetry.get_state() or {}).get("model") or {}
    except Exception:
        return {}


def served_model():
    info = _model_json()
    stem = Path(settings.ENGINE_MODEL).stem
    model_id = str(info.get("id") or info.get("name") or stem)
    ctx = info.get("ctx") or info.get("context_length") or settings.ENGINE_CTX
    return {"id": model_id, "aliases": {model_id, stem, *ALIASES}, "context_length": int(ctx)}


def model_entry(m):
    return {"id": m["id"], "object": "model", "created": STARTED, "owned_by": "colibri",
            "context_length": m["context_length"], "max_model_len": m["context_length"]}
