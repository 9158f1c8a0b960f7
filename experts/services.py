"""Atlas writes and reads (HackSoft style: keyword-only `<entity>_<action>` functions).

The model an atlas belongs to is the name the engine reports in its MODEL line, else the stem
of ENGINE_MODEL (engines without our extension), so atlases follow the model, not the process.
"""
import hashlib
from pathlib import Path

from django.conf import settings

from engine_bridge import telemetry
from experts import atlas_format
from experts.models import Atlas


def model_name_current(*, state=None):
    state = state if state is not None else telemetry.get_state()
    info = state.get("model") or {}
    return str(info.get("name") or Path(settings.ENGINE_MODEL).stem)


def atlas_import(*, content: bytes, model_name: str, filename: str = "", user=None,
                 source: str = Atlas.IMPORTED, validation=None) -> Atlas:
    """Validates colibri's format and stores the bytes unchanged as the model's newest atlas."""
    doc = atlas_format.loads(content)
    info = atlas_format.summary(doc)
    return Atlas.objects.create(
        model_name=model_name, source=source, content=bytes(content),
        sha256=hashlib.sha256(content).hexdigest(), filename=filename[:200],
        entries=info["entries"], specialists=info["specialists"], categories=doc["categories"],
        projection=atlas_format.projection(doc), validation=validation, created_by=user)


def atlas_current(*, model_name: str):
    """The model's newest atlas, or None."""
    return Atlas.objects.filter(model_name=model_name).first()


def atlas_history(*, model_name: str | None = None, limit: int = 50):
    qs = Atlas.objects.defer("content", "projection")
    if model_name:
        qs = qs.filter(model_name=model_name)
    return list(qs[:limit])


def row_layers(*, rows: int, model: dict | None, atlas_layers=()):
    """Absolute layer index of each EMAP row, and where that numbering came from.

    Never a constant: the engine's own list (`moe_layers` in MODEL) wins; else the layers of the
    current atlas when they are as many as the rows; else MoE layers are taken to be the last
    `rows` of MODEL's `n_layers` (leading dense layers, as in GLM and DeepSeek); else row = layer.
    """
    model = model or {}
    listed = model.get("moe_layers")
    if isinstance(listed, list) and len(listed) == rows:
        return [int(x) for x in listed], "engine"
    atlas_layers = sorted(set(atlas_layers))
    if rows and len(atlas_layers) == rows:
        return atlas_layers, "atlas"
    if rows and len(atlas_layers) == rows - 1 and atlas_layers[-1] - atlas_layers[0] == rows - 2:
        # One row more than the atlas has layers: the engine's extra (MTP) row, after the last.
        return atlas_layers + [atlas_layers[-1] + 1], "atlas+extra"
    n_layers = model.get("n_layers")
    if isinstance(n_layers, int) and n_layers >= rows:
        return list(range(n_layers - rows, n_layers)), "model"
    return list(range(rows)), "rows"
