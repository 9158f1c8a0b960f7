"""The builder's arithmetic: HITS counting, colibri's affinity/entropy/label rules, the gates,
leave-one-prompt-out, and the shipped probe set."""
import json

import numpy as np

from experts import atlas_format, builder


def test_it_counts_hits_windows_lsb_first():
    counts = builder.hits_counts(["f8fc", "0100"], rows=2, cols=8)
    assert counts[0].tolist() == [1, 0, 0, 1, 1, 1, 1, 1]
    assert counts[1].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]


def runs_with_a_sql_specialist():
    """Expert (0, 0) fires only on SQL; (0, 1) everywhere; (0, 2) too rarely; (0, 3) SQL once."""
    runs = []
    for cat in ("sql", "poetry", "law"):
        for i in range(3):
            c = np.zeros((1, 4))
            c[0, 1] = 20
            if cat == "sql":
                c[0, 0] = 15
                c[0, 3] = 40 if i == 0 else 0
            c[0, 2] = 1
            runs.append((cat, c))
    return runs


def test_it_labels_a_specialist_and_a_generalist_like_colibri():
    doc = builder.compute_atlas(runs_with_a_sql_specialist(), ["sql", "poetry", "law"], layers=[7])
    atlas_format.validate(doc)
    spec, gen = doc["experts"]["7:0"], doc["experts"]["7:1"]
    assert spec == {"affinity": {"sql": 1.0}, "entropy": -0.0, "top": "sql", "label": "specialist: sql"}
    assert gen["label"] == "generalist" and 1.4 < gen["entropy"] <= 1.59  # log2(3) = 1.585
    assert set(gen["affinity"]) == {"sql", "poetry", "law"}


def test_it_keeps_only_replicated_experts():
    doc = builder.compute_atlas(runs_with_a_sql_specialist(), ["sql", "poetry", "law"], layers=[7])
    assert "7:2" not in doc["experts"]   # 9 selections < 30
    assert "7:3" not in doc["experts"]   # 40 selections, but in 1 SQL run only


def test_it_corrects_for_the_base_rate_of_each_run():
    # Run sizes differ 10x; the same share of each run gives equal affinity.
    runs = [("a", np.array([[30, 70]])), ("a", np.array([[30, 70]])),
            ("b", np.array([[300, 700]])), ("b", np.array([[300, 700]]))]
    doc = builder.compute_atlas(runs, ["a", "b"], layers=[0])
    assert doc["experts"]["0:0"]["affinity"] == {"a": 0.5, "b": 0.5}


def test_it_validates_by_leaving_one_prompt_out():
    result = builder.leave_one_out(runs_with_a_sql_specialist(), ["sql", "poetry", "law"])
    assert result["total"] == 9
    # SQL runs are told apart; poetry and law look identical, so about half of those miss.
    assert 3 <= result["correct"] < 9


def test_it_ships_ten_categories_of_three_probes_in_interleaved_order():
    probes, chunk_words, digest = builder.load_probes()
    cats = {p.category for p in probes}
    assert len(cats) >= 10 and len(probes) >= 30 and chunk_words > 0 and len(digest) == 64
    assert all(a.category != b.category for a, b in zip(probes, probes[1:]))
    assert not any(p.text.startswith(builder.RESET_PROMPT) for p in probes)
    assert json.loads(builder.PROBES_FILE.read_text())["categories"].keys() == cats


def test_it_cuts_probes_after_words_never_inside_whitespace():
    assert builder.chunks("SELECT a,  b FROM t\nWHERE x", 2) == ["SELECT a,", "SELECT a,  b FROM", "SELECT a,  b FROM t\nWHERE", "SELECT a,  b FROM t\nWHERE x"]
    assert builder.chunks("one two", 4) == ["one two"]
    assert builder.chunks("ends with space ", 3) == ["ends with space", "ends with space "]


def test_it_asks_for_fewer_experts_only_from_engines_that_take_it():
    assert builder.probe_experts(2, {"experts_min": 1, "experts_max": 16}) == 2
    assert builder.probe_experts(2, {"name": "colibri without our MODEL fields"}) is None
    assert builder.probe_experts(None, {"experts_min": 1, "experts_max": 16}) is None
    assert builder.probe_experts(32, {"experts_min": 1, "experts_max": 16}) is None


def test_it_reads_a_requests_routing_as_counts():
    routing = {"rows": 2, "cols": 4, "counts": [[0, 1, 12], [0, 3, 3], [1, 0, 15]]}
    assert builder.routing_counts(routing).tolist() == [[0, 12, 0, 3], [15, 0, 0, 0]]


def test_it_measures_by_routes_only_on_engines_that_report_them():
    assert builder.routes_supported({"name": "tiny", "top_k": 2, "n_experts": 8})  # our MODEL line
    assert not builder.routes_supported({"name": "glm", "extensions": False})   # the real colibri
    assert not builder.routes_supported(None)


def test_it_probes_a_crowded_model_at_its_routers_first_choices():
    # The default model serves 15 of 16 experts per token: probes ask for 2.
    assert builder.probe_count({"top_k": 15, "n_experts": 16, "experts_min": 1, "experts_max": 16}) == 2
    # A sparse model (GLM-5: 8 of 256; the fixture: 2 of 8) is probed as it serves.
    assert builder.probe_count({"top_k": 8, "n_experts": 256, "experts_min": 1, "experts_max": 256}) is None
    assert builder.probe_count({"top_k": 2, "n_experts": 8, "experts_min": 1, "experts_max": 8}) is None
    # No MODEL line (the real colibri): nothing to decide with, nothing sent.
    assert builder.probe_count({"name": "glm", "extensions": False}) is None
    assert builder.probe_count(None) is None
