"""colibri's experts.json format: what validate() accepts and refuses, and the 2-D map."""
import json

import pytest

from experts import atlas_format
from experts.atlas_format import AtlasFormatError


def doc(**entry):
    base = {"affinity": {"a": 1.0}, "entropy": -0.0, "top": "a", "label": "specialist: a"}
    return {"categories": ["a", "b"], "experts": {"0:1": {**base, **entry}}}


def test_it_accepts_colibris_sample(sample_bytes):
    parsed = atlas_format.loads(sample_bytes)
    assert atlas_format.summary(parsed) == {"entries": 3, "specialists": 2, "layers": [3, 52, 77]}


@pytest.mark.parametrize("bad, message", [
    ({"affinity": {"c": 1.0}}, "unknown category"),
    ({"affinity": {"a": 0.5}}, "sums to"),
    ({"top": "z"}, "top"),
    ({"label": "specialist: b"}, "label"),
    ({"entropy": float("nan")}, "finite"),
    ({"entropy": 3.5}, "out of range"),
])
def test_it_refuses_broken_entries(bad, message):
    with pytest.raises(AtlasFormatError, match=message):
        atlas_format.validate(doc(**bad))


def test_it_refuses_bad_keys_and_non_json():
    broken = doc()
    broken["experts"] = {"layer0-1": broken["experts"]["0:1"]}
    with pytest.raises(AtlasFormatError, match="not '<layer>:<expert>'"):
        atlas_format.validate(broken)
    with pytest.raises(AtlasFormatError, match="JSON"):
        atlas_format.loads(b"{not json")


def test_it_dumps_the_same_bytes_for_the_same_document():
    first = atlas_format.dump(doc())
    assert first == atlas_format.dump(json.loads(first))
    assert b'"entropy":-0.0' in first


def test_it_projects_experts_apart_by_affinity(sample_bytes):
    points = atlas_format.projection(atlas_format.loads(sample_bytes))["points"]
    assert [p[0] for p in points] == ["3:7", "52:174", "77:255"]
    xy = {p[0]: (p[1], p[2]) for p in points}
    assert xy["52:174"] != xy["77:255"]
    assert all(-1.0 <= v <= 1.0 for p in points for v in p[1:3])
    assert points == atlas_format.projection(atlas_format.loads(sample_bytes))["points"]
