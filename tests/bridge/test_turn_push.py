"""Each finished turn's own figures (DONE: hit %, tok/s, tokens) go to the telemetry group as a
`turn` item, numbered like every other item: the atlas plots the engine's hit % per turn from it."""
from engine_bridge import protocol as p
from engine_bridge import worker


def test_a_done_pushes_its_turn_figures(settings):
    bridge = worker.Bridge(command=["true"])
    before = bridge.publisher.pushed
    bridge.on_event(p.Done(id=99, emitted=12, tok_s=41.5, hit_pct=87.5, rss_gb=0.3, prompt_tokens=7,
                          length_limited=False))
    turns = [item for item in bridge.publisher.push_items if "turn" in item]
    assert turns == [{"turn": {"hit_pct": 87.5, "tok_s": 41.5, "completion_tokens": 12}, "n": before + 1}]
