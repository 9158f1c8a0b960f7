"""The served model's facts, read once per request from the bridge's telemetry (one Redis read):
its typeable id, display name, accepted aliases, context, chat template, engine status.

Ids: `id` is a stable slug people can type (the model file's stem, e.g. `smollm2-135m-moe16`);
the engine's display name (its MODEL line, e.g. "SmolLM2-135M-Instruct MoE16 (…)") is still
accepted, as are the generic aliases `colibri` and `default`.
Invariant: an unknown model name is 404 only while the engine is up; while it is starting,
restarting or down it is 503 + Retry-After (never 404 model_not_found just because the MODEL line
has not arrived yet). A known name always goes on to the bridge, which is the authority on
whether the engine can take it (it answers ENGINE_UNAVAILABLE at once otherwise, also a 503):
a late telemetry heartbeat must not turn a servable request away.
"""
import re
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from api.errors import ApiError, unavailable
from engine_bridge import sampling
from engine_bridge.prompting import CHATML_TEMPLATE, CHATML_TOKENS

STARTED = int(time.time())
ALIASES = ("colibri", "default")
RETRY_AFTER_S = 2  # a restart costs seconds; the SDKs honour Retry-After


NO_BRIDGE = {"status": "down", "updated": None, "model": None}


def _read_state():
    from engine_bridge import telemetry

    try:
        return telemetry.get_state()
    except Exception:  # Redis down: no bridge we can see
        return NO_BRIDGE


async def _aread_state_and_boot():
    from engine_bridge import telemetry

    try:
        return await telemetry.aget_state_and_boot()
    except Exception:
        return NO_BRIDGE, None


def slugify(text):
    slug = re.sub(r"[^a-z0-9._-]+", "-", str(text).lower()).strip("-.")
    return re.sub(r"-{2,}", "-", slug)[:64] or "model"


@dataclass(frozen=True)
class ServedModel:
    id: str
    display_name: str
    aliases: frozenset
    context_length: int
    status: str             # up | starting | down
    extensions: bool        # the engine announced itself (MODEL line): seed and our extras work
    template: str
    bos_token: str
    eos_token: str
    experts_range: tuple | None = None  # (min, max) routed experts a request may ask for; None: not choosable
    sampling_defaults: tuple = (sampling.DEFAULT_TEMPERATURE, sampling.DEFAULT_TOP_P)  # for unnamed values
    grammar: bool = False   # it takes CGD1 grammars (MODEL "grammar"): structured output works
    boot: str | None = None  # the bridge boot alive when these facts were read ("" none; None unknown)

    @property
    def up(self):
        return self.status == "up"


def _extensions(info):
    """Whether the engine takes our SUBMIT extensions (seed=…): our engine announces itself with a
    MODEL line (it carries `arch`); facts the bridge publishes for another engine may say so."""
    if "extensions" in info:
        return bool(info["extensions"])
    return "arch" in info


def served_model_get():
    return served_model_from(_read_state())


async def aserved_model_get():
    """served_model_get on the event loop (no thread hop before a generation's first token), with
    the running bridge's boot read in the same round trip (a generation submits to it)."""
    state, boot = await _aread_state_and_boot()
    return served_model_from(state, boot=boot)


def served_model_from(state, *, boot=None):
    state = state or {}
    info = state.get("model") or {}
    status = (state.get("status") or ("up" if state.get("up") else "down")) if state.get("updated") else "down"
    source = info.get("file") or info.get("path") or settings.ENGINE_MODEL
    stem = Path(str(source)).stem
    slug = slugify(info.get("id") or stem)
    display = str(info.get("name") or stem)
    ctx = info.get("ctx") or info.get("context_length") or settings.ENGINE_CTX
    if info.get("chat_template"):
        template = (info["chat_template"], info.get("bos_token") or info.get("bos") or "",
                    info.get("eos_token") or info.get("eos") or "")
    elif settings.CHAT_TEMPLATE:
        template = (settings.CHAT_TEMPLATE, "", "")
    else:
        template = (CHATML_TEMPLATE, CHATML_TOKENS["bos_token"], CHATML_TOKENS["eos_token"])
    return ServedModel(
        id=slug, display_name=display, aliases=frozenset({slug, stem, display, slugify(display), *ALIASES}),
        context_length=int(ctx), status=status, extensions=_extensions(info), template=template[0],
        grammar=info.get("grammar") == "CGD1",
        bos_token=template[1], eos_token=template[2],
        experts_range=(int(info["experts_min"]), int(info["experts_max"])) if info.get("experts_max") else None,
        sampling_defaults=sampling.model_defaults(info),
        boot=boot,
    )


def model_check(served, name):
    """The id to echo back for `name`, or 503 (engine not ready) / 404 (unknown model)."""
    if name in served.aliases:
        return served.id
    if not served.up:
        raise unavailable(retry_after=RETRY_AFTER_S)
    raise ApiError(404, f"The model {name!r} does not exist; this server serves {served.id!r}",
                   param="model", code="model_not_found")


def render(served, messages):
    from engine_bridge.prompting import TemplateError, render_prompt

    from api.errors import bad_param

    try:
        return render_prompt(messages, template=served.template, bos_token=served.bos_token,
                             eos_token=served.eos_token)
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
