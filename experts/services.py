"""Atlas writes and reads (HackSoft style: keyword-only `<entity>_<action>` functions).

The model an atlas belongs to is the name the engine reports in its MODEL line, else the stem
of ENGINE_MODEL (engines without our extension), so atlases follow the model, not the process.
With several bridges the atlas page names the engine host it shows (`?bridge=<id>`): its library
then reads, imports and builds for the model that bridge serves (model_served_get).
"""
import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import numpy as np
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from colibri_base.layers import channel_layer
from engine_bridge.fleet import UnknownBridge
from engine_bridge.served import ServedModel, aserved_model_get, served_model_from, served_model_get, served_models_get
from experts import atlas_format, builder
from experts.models import Atlas, AtlasBuild

log = logging.getLogger(__name__)
STALE_BUILD_S = 600  # longer than any one probe can take (a probe may wait behind chats)
BUILD_GROUP = "atlas-builds"  # every atlas page's socket (experts.consumers joins it): build progress
OnProbe = Callable[[int, int, builder.Probe], object]  # (probes done, probes in all, the probe)
OnRetry = Callable[[builder.Probe, int], object]  # (the probe, its attempt)


def model_name_current(*, state: dict | None = None) -> str:
    """The served model's display name (engine_bridge.served), from `state` when given."""
    return (served_model_from(state) if state is not None else served_model_get()).display_name


def model_served_get(*, bridge: str | None = None) -> ServedModel:
    """The model the bridge `bridge` serves (None: the default model); UnknownBridge, naming it,
    when no live bridge has that id: a page must not silently show another host's model."""
    if not bridge:
        return served_model_get()
    models = served_models_get()  # each names the live bridges serving it
    found = next((m for m in models if bridge in m.bridges), None)
    if found is None:
        raise UnknownBridge(bridge, sorted(b for m in models for b in m.bridges))
    return found


def atlas_import(*, content: bytes, model_name: str, filename: str = "", user: User | None = None,
                 source: str = Atlas.IMPORTED, validation: dict[str, Any] | None = None) -> Atlas:
    """Validates colibri's format and stores the bytes unchanged as the model's newest atlas."""
    doc = atlas_format.loads(content)
    info = atlas_format.summary(doc)
    return Atlas.objects.create(
        model_name=model_name, source=source, content=bytes(content),
        sha256=hashlib.sha256(content).hexdigest(), filename=filename[:200],
        entries=info["entries"], specialists=info["specialists"], categories=doc["categories"],
        projection=atlas_format.projection(doc), validation=validation, created_by=user)


def atlas_current(*, model_name: str) -> Atlas | None:
    """The model's newest atlas, or None."""
    return Atlas.objects.filter(model_name=model_name).first()


def atlas_history(*, model_name: str | None = None, limit: int = 50) -> list[Atlas]:
    qs = Atlas.objects.defer("content", "projection")
    if model_name:
        qs = qs.filter(model_name=model_name)
    return list(qs[:limit])


def row_layers(*, rows: int, model: dict | None, atlas_layers: Iterable[int] = ()) -> tuple[list[int], str]:
    """Absolute layer index of each EMAP row, and where that numbering came from.

    Never a constant: the engine's own list (`moe_layers` in MODEL) wins; else the layers of the
    current atlas when they are as many as the rows; else MoE layers are taken to be the last
    `rows` of MODEL's `n_layers` (leading dense layers, as in GLM and DeepSeek); else row = layer.
    """
    model = model or {}
    listed = model.get("moe_layers")
    if isinstance(listed, list) and len(listed) == rows:
        return [int(x) for x in listed], "engine"
    known = sorted(set(atlas_layers))
    if rows and len(known) == rows:
        return known, "atlas"
    if rows and len(known) == rows - 1 and known[-1] - known[0] == rows - 2:
        # One row more than the atlas has layers: the engine's extra (MTP) row, after the last.
        return known + [known[-1] + 1], "atlas+extra"
    n_layers = model.get("n_layers")
    if isinstance(n_layers, int) and n_layers >= rows:
        return list(range(n_layers - rows, n_layers)), "model"
    return list(range(rows)), "rows"


# --- the atlas builder (experts/builder.py measures; these functions own the rows) -------------

def build_publish(*, build: AtlasBuild) -> None:
    """Pushes a build's progress to every atlas page (the /ws/atlas/ group)."""
    try:
        async_to_sync(channel_layer().group_send)(BUILD_GROUP, {"type": "atlas.build", "build": build.as_dict()})
    except Exception:  # progress is a courtesy; the row is the truth
        log.exception("publishing build %s failed", build.pk)


def build_start(*, user: User | None = None, model: ServedModel | None = None,
                enqueue: Callable[[int], object] | None = None) -> AtlasBuild:
    """Creates a build of `model`'s atlas (None: the default model); `enqueue(build id)` queues
    its job after commit (the view hands in experts.tasks.build_atlas.delay: the task module
    imports this one, so this one never imports it); without it the caller runs build_run itself.
    The build records the served id: its probes go to a bridge serving that model.
    One build per model at a time: its unfinished build is returned instead of starting a second."""
    _fail_stale_builds()
    model = model or served_model_get()
    running = AtlasBuild.objects.filter(model_name=model.display_name).exclude(status__in=AtlasBuild.FINAL).first()
    if running is not None:
        return running
    probes, _, _ = builder.load_probes()
    build = AtlasBuild.objects.create(model_name=model.display_name, served_model=model.id, total=len(probes),
                                      created_by=user)
    if enqueue is not None:
        transaction.on_commit(lambda: enqueue(build.pk))
    build_publish(build=build)
    return build


def _fail_stale_builds() -> None:
    """A running build whose job died (worker killed) would block every later build: one that
    saved no progress for STALE_BUILD_S is marked failed."""
    cutoff = timezone.now() - timedelta(seconds=STALE_BUILD_S)
    AtlasBuild.objects.filter(status=AtlasBuild.RUNNING, updated__lt=cutoff).update(
        status=AtlasBuild.FAILED, error="the build job stopped reporting progress")


def build_cancel(*, build: AtlasBuild) -> AtlasBuild:
    """Asks a build to stop; the job stops before its next probe. A queued build stops at once."""
    updated = AtlasBuild.objects.filter(pk=build.pk, status=AtlasBuild.QUEUED).update(
        status=AtlasBuild.CANCELLED, cancel_requested=True)
    if not updated:
        AtlasBuild.objects.filter(pk=build.pk).exclude(status__in=AtlasBuild.FINAL).update(cancel_requested=True)
    build.refresh_from_db()
    build_publish(build=build)
    return build


def _progress(build: AtlasBuild, **fields: Any) -> None:
    for k, v in fields.items():
        setattr(build, k, v)
    build.save(update_fields=[*fields, "updated"])
    build_publish(build=build)


def build_run(*, build_id: int, on_probe: OnProbe | None = None, on_retry: OnRetry | None = None,
              experts: int | None = None) -> AtlasBuild:
    """The job: runs every probe through the bridge, computes the atlas, stores it as the model's
    newest. Claims the build with an atomic UPDATE, so a second worker never runs it twice.
    `experts`: routed experts per token for the probes instead of probes.json's choice
    (measurements; manage.py build_atlas --experts)."""
    if not AtlasBuild.objects.filter(pk=build_id, status=AtlasBuild.QUEUED).update(status=AtlasBuild.RUNNING):
        return AtlasBuild.objects.get(pk=build_id)
    build = AtlasBuild.objects.get(pk=build_id)
    build_publish(build=build)
    started = time.monotonic()
    try:
        runs, layers, method = async_to_sync(_measure)(build, on_probe, on_retry, experts)
        probes, _, _ = builder.load_probes()
        categories = list(dict.fromkeys(p.category for p in probes))
        doc = builder.compute_atlas(runs, categories, layers)
        validation = {**builder.leave_one_out(runs, categories), **method}
        atlas = atlas_import(content=atlas_format.dump(doc), model_name=build.model_name, filename="experts.json",
                             user=build.created_by, source=Atlas.BUILT, validation=validation)
        _progress(build, status=AtlasBuild.DONE, atlas=atlas, wall_s=round(time.monotonic() - started, 2))
    except builder.BuildCancelled:
        _progress(build, status=AtlasBuild.CANCELLED, wall_s=round(time.monotonic() - started, 2))
    except Exception as exc:
        log.exception("atlas build %s failed", build.pk)
        _progress(build, status=AtlasBuild.FAILED, error=str(exc)[:500] or type(exc).__name__,
                  wall_s=round(time.monotonic() - started, 2))
    return build


async def _measure(build: AtlasBuild, on_probe: OnProbe | None, on_retry: OnRetry | None,
                   wanted: int | None = None) -> tuple[list[tuple[str, np.ndarray]], list[int], dict[str, Any]]:
    probes, chunk_words, digest = builder.load_probes()
    served = await _build_model(build)
    model = served.info or None
    experts = builder.probe_experts(wanted or builder.load_probe_experts() or builder.probe_count(model), model)
    key = f"atlas-build:{build.pk}"
    target = build.served_model or None  # rows from before the field: the default model, as then
    runner: builder.RoutesRunner | builder.ProbeRunner
    if builder.routes_supported(model):
        runner = builder.RoutesRunner(key=key, experts=experts, model=target)
    else:
        runner = builder.ProbeRunner(key=key, chunk_words=chunk_words, experts=experts, model=target,
                                     bridges=frozenset(served.bridges) or None)
    runs: list[tuple[str, np.ndarray]] = []
    shape: tuple[int, ...] | None = None
    async with runner:
        if isinstance(runner, builder.ProbeRunner):
            runner.drain()
        for i, probe in enumerate(probes):
            for attempt in range(builder.MAX_ATTEMPTS):
                if await _cancel_requested(build.pk):
                    raise builder.BuildCancelled()
                counts = await runner.run(probe)
                if counts is not None:
                    break
                # hits: someone else's request ran alongside; routes: the probe reused KV.
                # Wait for a quiet engine, longer each time.
                if on_retry:
                    on_retry(probe, attempt)
                await asyncio.sleep(min(builder.RETRY_WAIT_S * 2 ** attempt, builder.RETRY_WAIT_MAX_S))
            else:
                raise builder.BuildError(f"probe {probe.category}/{probe.index} never ran alone")
            if shape not in (None, counts.shape):
                raise builder.BuildError("the engine's expert map changed shape during the build")
            shape = counts.shape
            runs.append((probe.category, counts))
            await _save_progress(build, i + 1)
            if on_probe:
                on_probe(i + 1, len(probes), probe)
    if shape is None:
        raise builder.BuildError("probes.json lists no probes")
    model = (await _build_model(build)).info or model or {}
    layers, _ = row_layers(rows=shape[0], model=model)
    method: dict[str, Any] = {"method": runner.method, "experts": experts, "top_k": model.get("top_k"),
              "n_experts": shape[1], "probes_sha256": digest}
    if runner.method == "hits":
        method["chunk_words"] = chunk_words
    return runs, layers, method


async def _build_model(build: AtlasBuild) -> ServedModel:
    """The served facts of the model the build is for; BuildError once no live bridge serves it."""
    served = await aserved_model_get(build.served_model or None, with_boot=False)
    if served is None:
        raise builder.BuildError(f"no live bridge serves the model {build.served_model!r} any more")
    return served


@database_sync_to_async
def _cancel_requested(build_id: int) -> bool:
    return AtlasBuild.objects.filter(pk=build_id, cancel_requested=True).exists()


@database_sync_to_async
def _save_progress(build: AtlasBuild, done: int) -> None:
    _progress(build, done=done)
