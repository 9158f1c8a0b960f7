"""Our engine's SLOTMEM line (in a turn's end block): the bridge keeps each slot's latest figures in
the telemetry state (`slot_memory`, by slot, read by /ops/stats.json); an engine that sends none
leaves it None."""
import pytest

from engine_bridge import protocol as p
from engine_bridge import worker


def test_it_parses_slotmem_and_sums_its_total():
    ev = p.parse_line("SLOTMEM 2 131584 84480 4")
    assert ev == p.SlotMem(2, 131584, 84480, 4)
    assert ev.figures() == {"kv_bytes": 131584, "state_bytes": 84480, "checkpoints": 4, "total_bytes": 216064}


@pytest.mark.parametrize("line", ["SLOTMEM 1 2 3", "SLOTMEM -1 0 0 0", "SLOTMEM 0 x 0 0", "SLOTMEM 0 1 -2 0"])
def test_a_malformed_slotmem_is_a_protocol_error(line):
    with pytest.raises(p.ProtocolError):
        p.parse_line(line)


def test_each_slots_latest_figures_reach_the_telemetry_state():
    bridge = worker.Bridge(command=["true"])
    assert bridge.publisher.state["slot_memory"] is None
    bridge.on_event(p.parse_line("SLOTMEM 0 1000 0 0"))
    bridge.on_event(p.parse_line("SLOTMEM 1 2000 500 2"))
    bridge.on_event(p.parse_line("SLOTMEM 0 3000 0 0"))     # slot 0's next turn replaces its figures
    mem = bridge.publisher.state["slot_memory"]
    assert mem == {"0": p.SlotMem(0, 3000, 0, 0).figures(), "1": p.SlotMem(1, 2000, 500, 2).figures()}
