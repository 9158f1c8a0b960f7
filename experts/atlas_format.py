"""colibri's experts.json: validation, canonical writing, and the numbers derived from it.

Format (../shared/reference/peers.md §4): {"categories": [...], "experts": {"<layer>:<expert>":
{"affinity": {cat: p}, "entropy": bits, "top": cat, "label": "specialist: <cat>" | "generalist"}}}.
Layers in keys are absolute layer indices, so nothing here assumes an offset.

Invariants:
* an imported file is kept byte for byte (export = the bytes that came in); validate() only reads;
* dump() is the one writer for atlases we build: fixed key order, fixed separators, floats as
  Python's repr (what json.dumps writes), so the same document always gives the same bytes.
"""
import json
import math
from typing import Any

import numpy as np

MAX_BYTES = 64 * 1024 * 1024
SUM_TOLERANCE = 0.02  # affinities are rounded to 4 decimals and zeros dropped


class AtlasFormatError(ValueError):
    """The file is not in colibri's experts.json format; the message says where."""


def parse_key(key: object) -> tuple[int, int]:
    """"52:174" -> (52, 174); AtlasFormatError otherwise."""
    layer, sep, expert = str(key).partition(":")
    if not sep or not layer.isdigit() or not expert.isdigit():
        raise AtlasFormatError(f"expert key {key!r} is not '<layer>:<expert>'")
    return int(layer), int(expert)


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AtlasFormatError(f"{where} must be a finite number")
    return float(value)


def _check_entry(key: str, entry: object, categories: set[str]) -> None:
    if not isinstance(entry, dict):
        raise AtlasFormatError(f"experts[{key!r}] must be an object")
    affinity = entry.get("affinity")
    if not isinstance(affinity, dict) or not affinity:
        raise AtlasFormatError(f"experts[{key!r}].affinity must be a non-empty object")
    total = 0.0
    for cat, p in affinity.items():
        if cat not in categories:
            raise AtlasFormatError(f"experts[{key!r}].affinity names unknown category {cat!r}")
        p = _number(p, f"experts[{key!r}].affinity[{cat!r}]")
        if not 0.0 <= p <= 1.0:
            raise AtlasFormatError(f"experts[{key!r}].affinity[{cat!r}] must lie in [0, 1]")
        total += p
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise AtlasFormatError(f"experts[{key!r}].affinity sums to {total:.4f}, not 1")
    entropy = _number(entry.get("entropy"), f"experts[{key!r}].entropy")
    if entropy < 0 or entropy > math.log2(len(categories)) + 0.01:
        raise AtlasFormatError(f"experts[{key!r}].entropy {entropy} is out of range")
    top = entry.get("top")
    if top not in categories:
        raise AtlasFormatError(f"experts[{key!r}].top must be one of the categories")
    label = entry.get("label")
    if label != "generalist" and label != f"specialist: {top}":
        raise AtlasFormatError(f"experts[{key!r}].label must be 'generalist' or 'specialist: {top}'")


def validate(doc: object) -> dict[str, Any]:
    """Raises AtlasFormatError unless doc is a colibri experts.json document. Extra fields are
    allowed (colibri's reader ignores them)."""
    if not isinstance(doc, dict):
        raise AtlasFormatError("the document must be a JSON object")
    categories = doc.get("categories")
    if (not isinstance(categories, list) or not categories
            or not all(isinstance(c, str) and c for c in categories)):
        raise AtlasFormatError("categories must be a non-empty list of names")
    if len(set(categories)) != len(categories):
        raise AtlasFormatError("categories must not repeat")
    experts = doc.get("experts")
    if not isinstance(experts, dict):
        raise AtlasFormatError("experts must be an object keyed '<layer>:<expert>'")
    cats = set(categories)
    for key, entry in experts.items():
        parse_key(key)
        _check_entry(key, entry, cats)
    return doc


def loads(content: bytes) -> dict[str, Any]:
    """Parses and validates the bytes of an experts.json file; returns the document."""
    if len(content) > MAX_BYTES:
        raise AtlasFormatError(f"the file is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        doc = json.loads(content.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AtlasFormatError(f"not valid UTF-8 JSON: {exc}") from None
    return validate(doc)


def dump(doc: dict[str, Any]) -> bytes:
    """Canonical bytes of a document we wrote (built atlases)."""
    return (json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Counts shown next to an atlas: entries, specialists, layers present."""
    experts = doc["experts"]
    layers = sorted({parse_key(k)[0] for k in experts})
    specialists = sum(1 for e in experts.values() if e["label"] != "generalist")
    return {"entries": len(experts), "specialists": specialists, "layers": layers}


def projection(doc: dict[str, Any]) -> dict[str, Any]:
    """Every expert placed in 2-D by its affinity vector: the first two principal components
    (numpy SVD of the centred vectors). Signs are fixed (largest loading positive) so the same
    atlas always gives the same picture. Returns {"categories", "points": [[key, x, y, top], ...]}."""
    categories = doc["categories"]
    index = {c: i for i, c in enumerate(categories)}
    keys = sorted(doc["experts"], key=parse_key)
    if not keys:
        return {"categories": categories, "points": []}
    vectors = np.zeros((len(keys), len(categories)))
    for row, key in enumerate(keys):
        for cat, p in doc["experts"][key]["affinity"].items():
            vectors[row, index[cat]] = p
    centred = vectors - vectors.mean(axis=0)
    if len(keys) < 2 or not centred.any():
        coords = np.zeros((len(keys), 2))
    else:
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        axes = vt[:2]
        for axis in axes:
            if axis[np.argmax(np.abs(axis))] < 0:
                axis *= -1
        coords = centred @ axes.T
        if coords.shape[1] < 2:
            coords = np.hstack([coords, np.zeros((len(keys), 1))])
        span = np.abs(coords).max() or 1.0
        coords = coords / span
    points = [[k, round(float(x), 4), round(float(y), 4), doc["experts"][k]["top"]]
              for k, (x, y) in zip(keys, coords)]
    return {"categories": categories, "points": points}
