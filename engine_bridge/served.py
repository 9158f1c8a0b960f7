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

Several bridges (engine_bridge.registry): one ServedModel per distinct model id among the live
bridges, its facts read from the state of one bridge serving it (an engine that is up first),
`bridges` naming all of them. The generic aliases and None mean the default model
(settings.DEFAULT_MODEL when served, else the first by bridge id). With no live bridge at all
the default bridge's last state answers, status down, whatever model was asked for: the surfaces
then say 503 (come back later), not 404 (no such model).
"""
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from django.conf import settings

from engine_bridge import registry, sampling
from engine_bridge.prompting import CHATML_TEMPLATE, CHATML_TOKENS

ALIASES = ("colibri", "default")
NO_BRIDGE = {"status": "down", "updated": None, "model": None}

_last_model: dict = {}  # the model info last read: an outage keeps its template


def _remember(state: dict) -> dict:
    info = (state or {}).get("model")
    if info:
        _last_model["info"] = info
    return state


def _outage_state() -> dict:
    return {**NO_BRIDGE, "model": _last_model.get("info")}


def _read_state() -> dict:
    from engine_bridge import telemetry

    try:
        return _remember(telemetry.get_state())
    except Exception:  # Redis down: no bridge we can see
        return _outage_state()


async def _aread_state() -> dict:
    from engine_bridge import telemetry

    try:
        return _remember(await telemetry.aget_state())
    except Exception:
        return _outage_state()


async def _aread_state_and_boot() -> tuple[dict, str | None]:
    from engine_bridge import telemetry

    try:
        state, boot = await telemetry.aget_state_and_boot()
    except Exception:
        return _outage_state(), None
    return _remember(state), boot


def slugify(text: object) -> str:
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
    bridges: tuple = ()      # ids of the live bridges serving it (engine_bridge.registry)
    info: dict = field(default_factory=dict, compare=False, hash=False)  # the raw MODEL dict, for engine details

    @property
    def up(self) -> bool:
        return self.status == "up"


def _extensions(info: dict) -> bool:
    """Our engine describes itself (a MODEL line); facts the bridge publishes for another engine
    say `extensions: false` (jobs.started_facts)."""
    return bool(info) and info.get("extensions", True) is not False


def served_model_from(state: dict | None, *, boot: str | None = None, bridges: tuple = ()) -> ServedModel:
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
        boot=boot, bridges=tuple(bridges), info=dict(info),
    )


def _serving(bridges: list, model: str | None) -> tuple[list, bool]:
    """(the live bridges serving `model` by id — None and the generic aliases: the default model
    —, best first: an engine that is up, then by id; whether an exact id or generic name decided
    it: False means `model` may still be another alias, such as a display name)."""
    exact = model is None or model in ALIASES
    wanted = registry.default_model(bridges) if exact else model
    serving = sorted((b for b in bridges if b.model == wanted), key=lambda b: (b.status != "up", b.id))
    return serving, exact or bool(serving)


def _from_bridge(state: dict, serving: list, boot: str | None = None) -> ServedModel:
    return served_model_from(_remember(state), boot=boot, bridges=tuple(b.id for b in serving))


def _by_alias(models: list[ServedModel], model: str) -> ServedModel | None:
    return next((m for m in models if model == m.id), None) or next((m for m in models if model in m.aliases), None)


def _firsts(bridges: list) -> list[list]:
    """Per distinct model id among `bridges`, sorted by id: its serving bridges, best first."""
    return [_serving(bridges, model)[0] for model in sorted({b.model for b in bridges})]


def served_models_get() -> list[ServedModel]:
    """One per distinct model id among the live bridges, sorted by id ([] when none lives)."""
    from engine_bridge import telemetry

    try:
        return [_from_bridge(telemetry.get_state(serving[0].id), serving, serving[0].boot)
                for serving in _firsts(registry.bridges_get())]
    except Exception:  # Redis down: no bridge we can see
        return []


async def aserved_models_get() -> list[ServedModel]:
    """served_models_get on the event loop (GET /v1/models: no thread hop)."""
    from engine_bridge import telemetry

    try:
        return [_from_bridge(await telemetry.aget_state(serving[0].id), serving, serving[0].boot)
                for serving in _firsts(await registry.abridges_get())]
    except Exception:
        return []


@overload
def served_model_get(model: None = None) -> ServedModel: ...  # the default model is always one
@overload
def served_model_get(model: str) -> ServedModel | None: ...


def served_model_get(model: str | None = None) -> ServedModel | None:
    """The served model named `model` (an id or alias; None: the default model), None when live
    bridges run but none serves it; with no live bridge, the default bridge's facts, status down."""
    from engine_bridge import telemetry

    try:
        bridges = registry.bridges_get()
    except Exception:
        return served_model_from(_outage_state())
    if not bridges:
        return served_model_from(_read_state())
    serving, decided = _serving(bridges, model)
    if serving:
        try:
            return _from_bridge(telemetry.get_state(serving[0].id), serving)
        except Exception:
            return served_model_from(_outage_state())
    return None if decided else _by_alias(served_models_get(), str(model))


@overload
async def aserved_model_get(model: None = None, *, with_boot: bool = True) -> ServedModel: ...
@overload
async def aserved_model_get(model: str, *, with_boot: bool = True) -> ServedModel | None: ...


async def aserved_model_get(model: str | None = None, *, with_boot: bool = True) -> ServedModel | None:
    """served_model_get on the event loop (no thread hop before a generation's first token), with
    the boot of the bridge its facts came from read in the same round trip (`boot`)."""
    from engine_bridge import telemetry

    try:
        bridges = await registry.abridges_get()
    except Exception:
        return served_model_from(_outage_state())
    if not bridges:
        if not with_boot:
            return served_model_from(await _aread_state())
        state, boot = await _aread_state_and_boot()
        return served_model_from(state, boot=boot)
    serving, decided = _serving(bridges, model)
    if not serving:
        return None if decided else _by_alias(await aserved_models_get(), str(model))
    first = serving[0]
    known = _facts.get((first.id, first.boot, first.model_rev))
    if known is not None:
        return _from_bridge({"model": known, "status": first.status, "updated": True}, serving, first.boot)
    try:
        state = await telemetry.aget_state(first.id)
    except Exception:
        return served_model_from(_outage_state())
    _learn(first, state)
    return _from_bridge(state, serving, first.boot)


# (bridge id, boot, model_rev) -> the model facts that bridge published. A registration names the
# digest of its bridge's facts (registry.model_rev) and its status, so a request whose bridge still
# registers the facts read before needs only the registry snapshot: the bridge's telemetry state
# (kilobytes of EMAP/HITS on a big model) was read and decoded per request for its `model` alone.
_facts: dict[tuple[str, str, str], dict] = {}
FACTS_KEPT = 64


def _learn(bridge: registry.BridgeInfo, state: dict) -> None:
    """Keeps the state's model facts when they are the ones the registration names."""
    info = state.get("model")
    if info and bridge.model_rev and registry.model_rev(info) == bridge.model_rev:
        if len(_facts) >= FACTS_KEPT:
            _facts.clear()
        _facts[(bridge.id, bridge.boot, bridge.model_rev)] = info
