"""Our engine's IOSTAT line (once per turn, right before DONE): the bridge keeps the latest turn's
figures in the telemetry state (`iostat`, read by /v1/stats and /ops) and hands the turn's own to
its done event (`io`, stored with a chat message and shown beside its routing). An engine that
sends none (the real colibri binary) leaves both None."""
from engine_bridge import protocol as p
from engine_bridge import worker
from engine_bridge.request import GenerationRequest


def bridge_with_request(eng_id):
    bridge = worker.Bridge(command=["true"])
    r = worker.Request(req="r1", job=GenerationRequest(prompt="hi", max_tokens=4), eng_id=eng_id, slot=0)
    bridge.admission.requests[r.req], bridge.admission.running[eng_id] = r, r
    finals = []
    bridge.admission.finish = lambda req, final: finals.append(final)
    bridge.admission.release = lambda req: None
    return bridge, finals


def done(eng_id):
    return p.parse_line(f"DONE {eng_id} STAT 4 40.00 75.0 0.30 16 1")


def test_a_turns_iostat_reaches_the_telemetry_state_and_its_done():
    bridge, finals = bridge_with_request(5)
    assert bridge.publisher.state["iostat"] is None
    bridge.on_event(p.parse_line("IOSTAT 5 20 4000000 1000000 150 200 0.250 40 30"))
    bridge.on_event(done(5))
    figures = p.IoStat(5, 20, 4000000, 1000000, 150, 200, 0.25, 40, 30).figures()
    assert bridge.publisher.state["iostat"] == figures
    assert finals[0]["kind"] == "done" and finals[0]["io"] == figures
    assert figures["disk_bytes_per_token"] == 200000.0 and figures["hit_pct"] == 75.0


def test_without_iostat_the_done_says_none_and_another_requests_iostat_is_not_taken():
    bridge, finals = bridge_with_request(6)
    bridge.on_event(p.parse_line("IOSTAT 99 20 0 0 0 0 0.000 0 0"))  # a request the bridge does not know
    bridge.on_event(done(6))
    assert finals[0]["io"] is None
    assert bridge.publisher.state["iostat"]["id"] == 99  # still the engine's latest turn
