"""The one reader of the served model's facts: what the bridge published about the model it runs
(telemetry `model`: our engine's MODEL line, or started_facts for an engine that sends none),
turned into one ServedModel. The API (api.served), the chat template (prompting), the chat
relay (may a turn ask for routes?), the atlas builder and /health all read the model here, so
a fact (a new MODEL key, a changed rule) is decided once.

Invariants: `extensions` is true only for an engine that described itself (a MODEL dict that
does not say `extensions: false`): only such an engine takes key=value SUBMIT fields. A Redis
outage does not change the template: the last model read is kept and served with status down.
Ids: `id` is a stable slug people can type (the model file's stem, e.g. `smollm2-135m-moe16`);
the display name and the generic aliases `colibri` and `default` are accepted too.
"""
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from django.conf import settings

from engine_bridge import sampling
from engine_bridge.prompting import CHATML_TEMPLATE, CHATML_TOKENS

ALIASES = ("colibri", "default")
NO_BRIDGE = {"status": "down", "updated": None, "model": None}

_last_model: dict = {}  # the model info last read: an outage keeps its template


def _remember(state):
    info = (state or {}).get("model")
    if info:
        _last_model["info"] = info
    return state


def _outage_state():
    return {**NO_BRIDGE, "model": _last_model.get("info")}


def _read_state():
    from engine_bridge import telemetry

    try:
        return _remember(telemetry.get_state())
    except Exception:  # Redis down: no bridge we can see
        return _outage_state()


async def _aread_state():
    from engine_bridge import telemetry

    try:
        return _remember(await telemetry.aget_state())
    except Exception:
        return _outage_state()


async def _aread_state_and_boot():
    from engine_bridge import telemetry

    try:
        state, boot = await telemetry.aget_state_and_boot()
    except Exception:
        return _outage_state(), None
    return _remember(state), boot


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
    extensions: bool        # the engine described itself (MODEL line): seed and our extras work
    template: str
    bos_token: str
    eos_token: str
    grammar: bool = False   # it takes CGD1 grammars (MODEL "grammar"): constrained decoding works
    experts_range: tuple | None = None  # (min, max) routed experts a request may ask for; None: not choosable
    experts_default: int | None = None  # the model's own routed experts per token (top_k)
    sampling_defaults: tuple = (sampling.DEFAULT_TEMPERATURE, sampling.DEFAULT_TOP_P)  # for unnamed values
    boot: str | None = None  # the bridge boot alive when these facts were read ("" none; None unknown)
    info: dict = field(default_factory=dict, compare=False, hash=False)  # the raw MODEL dict, for engine details
    bridges: tuple = ()  # ids of the live bridges serving it (TEMPORARY shim until h_reg: the one bridge)

    @property
    def up(self):
        return self.status == "up"


def _extensions(info):
    """Our engine describes itself (a MODEL line); facts the bridge publishes for another engine
    say `extensions: false` (jobs.started_facts)."""
    return bool(info) and info.get("extensions", True) is not False


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
        experts_range=(int(info.get("experts_min") or 1), int(info["experts_max"])) if info.get("experts_max") else None,
        experts_default=info.get("top_k"),
        sampling_defaults=sampling.model_defaults(info),
        boot=boot, info=dict(info),
    )


def _one_bridge(state, *, boot=None):
    """TEMPORARY shim of the multi-bridge interface (h_reg's version replaces it): the one bridge
    as "main" while its state is fresh."""
    served = served_model_from(state, boot=boot)
    return replace(served, bridges=("main",) if (state or {}).get("updated") else ())


def _pick(served, model):
    """The interface's rule on one bridge: the default for None, the model for one of its names,
    None for a name it does not serve (while no bridge is live: the down model, so 503)."""
    if model is None or model in served.aliases or not served.bridges:
        return served
    return None


def served_models_get():
    served = _one_bridge(_read_state())
    return [served] if served.bridges else []


def served_model_get(model=None):
    return _pick(_one_bridge(_read_state()), model)


async def aserved_model_get(model=None, *, with_boot=True):
    """served_model_get on the event loop (no thread hop before a generation's first token), with
    the running bridge's boot read in the same round trip (a generation submits to it)."""
    if not with_boot:
        return _pick(_one_bridge(await _aread_state()), model)
    state, boot = await _aread_state_and_boot()
    return _pick(_one_bridge(state, boot=boot), model)
