"""The expert store's disk path through the protocol (issue 23 item 4): IOSTAT's per-turn figures,
reads on the I/O lanes and the lookahead, under a RAM budget and without one.

The oracle for the figures is the store's own arithmetic, which the protocol states: with every
expert in RAM nothing is read and every acquisition hits; under a budget the bytes read are
whole experts (a multiple of one expert's file bytes) and never more than the acquisitions' ideal;
the acquisitions of a turn are (tokens forwarded) x (MoE layers) x (experts per token) at most.
And the reads change no result: the same greedy text with any budget, lane count or lookahead.
"""
from __future__ import annotations

from tests.native.engine import chatml

PROMPT = chatml("Tell me about the ocean and the ships on it.")
# the "big" fixture: 8 MoE layers x 16 experts, top-2; an expert = 2 x (64 x 128 Q8_0) + 128 x 64 F16
GATE_UP_SLICE, DOWN_SLICE = 64 * 128 // 32 * 34, 128 * 64 * 2
EXPERT_FILE_BYTES = 2 * GATE_UP_SLICE + DOWN_SLICE
ROWS, TOP_K = 8, 2


def slices_read(disk_bytes: int) -> tuple[int, int] | None:
    """(gate and up slices, down slices) that add up to disk_bytes, each expert's slices read in
    order (gate, up, down: its down only with both others), the most whole experts first; None
    when no such count gives the bytes."""
    for down in range(disk_bytes // DOWN_SLICE, -1, -1):
        rest = disk_bytes - down * DOWN_SLICE
        if rest % GATE_UP_SLICE == 0 and rest // GATE_UP_SLICE >= 2 * down:
            return rest // GATE_UP_SLICE, down
    return None


def iostat(e, r):
    lines = [parts for kind, parts, _ in e.events[r.first_event:r.last_event + 1]
             if kind == "IOSTAT" and parts[1] == str(r.id)]
    assert len(lines) == 1, f"request {r.id}: {len(lines)} IOSTAT lines"
    f = lines[0][2:]
    assert len(f) == 8, f"IOSTAT {r.id}: {' '.join(f)}"
    keys = ("tokens", "disk_bytes", "ideal_bytes", "hits", "acquisitions", "stall_s", "ahead_issued", "ahead_used")
    return {k: (float(v) if k == "stall_s" else int(v)) for k, v in zip(keys, f)}


def test_it_reports_no_reads_when_every_expert_is_in_ram(spawn):
    e = spawn(model="big", slots=1)
    r = e.generate(PROMPT, max_tokens=16)
    s = iostat(e, r)
    assert s["tokens"] == r.prompt_tokens + r.stat()["emitted"]
    assert s["disk_bytes"] == 0 and s["hits"] == s["acquisitions"] > 0, s
    assert s["ideal_bytes"] > 0 and s["ahead_issued"] == 0, s
    assert s["acquisitions"] <= s["tokens"] * ROWS * TOP_K, s
    assert e.close() == 0


def test_it_reads_whole_experts_within_the_ideal_under_a_budget(spawn):
    """Every miss is read whole; what else is read is the part of a wrong guess that a lane had
    begun before the layer's routing stopped it (its gate, or its gate and up), never more."""
    e = spawn(model="big", slots=1, EXPERT_RAM_MB=1, PIN_MB=0)
    r = e.generate(PROMPT, max_tokens=24)
    s = iostat(e, r)
    assert 0 < s["disk_bytes"] <= s["ideal_bytes"], s
    split = slices_read(s["disk_bytes"])
    assert split is not None, f"{s['disk_bytes']} B is no count of whole slices read in order: {s}"
    gate_up, whole = split
    assert whole >= s["acquisitions"] - s["hits"], f"a miss was not read whole: {split}, {s}"
    assert gate_up - 2 * whole <= 2 * (s["ahead_issued"] - s["ahead_used"]), f"more than wrong guesses' slices: {split}, {s}"
    assert 0 <= s["hits"] < s["acquisitions"], s
    assert s["ahead_issued"] > 0 and 0 <= s["ahead_used"] <= s["ahead_issued"], s
    assert s["stall_s"] >= 0.0
    assert e.close() == 0


def test_the_disk_path_changes_no_text(spawn):
    """Greedy text with every expert in RAM == under a budget of a few experts, with one lane or
    none, with and without the lookahead (the reads fill the same bytes; results never depend on
    where an expert came from)."""
    texts = {}
    for name, env in (("ram", {}), ("budget", {"EXPERT_RAM_MB": 1, "PIN_MB": 0}),
                      ("no-lanes", {"EXPERT_RAM_MB": 1, "IO_LANES": 0}),
                      ("one-lane-no-lookahead", {"EXPERT_RAM_MB": 1, "IO_LANES": 1, "EXPERT_LOOKAHEAD": 0}),
                      ("zero-budget", {"EXPERT_RAM_MB": 0})):
        e = spawn(model="big", slots=2, **env)
        ids = [e.submit(PROMPT, slot=k, max_tokens=20) for k in (0, 1)]    # two at once: batched
        texts[name] = [e.result(i).text for i in ids]
        assert e.close() == 0
    assert texts["ram"][0], "no text"
    for name, t in texts.items():
        assert t == texts["ram"], f"{name}: text differs from the all-in-RAM run"


def test_it_refuses_a_bad_lookahead_setting(spawn):
    e = spawn(model="big", slots=1, wait_ready=False, EXPERT_LOOKAHEAD=2)
    assert e.wait_exit() == 2


def test_a_wrong_guess_not_yet_read_is_never_read(spawn):
    """The lookahead guesses the next layer's experts and queues their reads; when that layer's
    routing picks others, the guesses no lane has begun are cancelled, so the disk spends no time
    on them in front of the real misses. With no lanes (IO_LANES=0: the forward's thread reads
    when it waits) no guess has begun by then, and with no budget nothing stays in RAM: every
    expert read is one an acquisition asked for, exactly once."""
    e = spawn(model="big", slots=1, EXPERT_RAM_MB=0, IO_LANES=0)
    r = e.generate(PROMPT, max_tokens=24)
    s = iostat(e, r)
    assert s["ahead_issued"] > s["ahead_used"] > 0, f"the lookahead guessed no wrong (or no right) expert: {s}"
    assert s["hits"] == 0, s
    assert s["disk_bytes"] == s["acquisitions"] * EXPERT_FILE_BYTES, (
        f"{s['disk_bytes'] / EXPERT_FILE_BYTES:g} experts read for {s['acquisitions']} acquisitions "
        f"({s['ahead_issued'] - s['ahead_used']} wrong guesses): {s}")
    assert e.close() == 0
