"""The engine-wide telemetry lines (MODEL, HWINFO, TIERS, EMAP, HITS, GPUS, ENTROPY, REPIN, PROF,
IOSTAT, SLOTMEM) into the bridge's published state (engine_bridge.telemetry.Publisher), and the per-turn
block that belongs to the next DONE (mux-protocol.md §4.6, §12 item 12).

Why a table: one engine line per token passes the bridge's dispatch, so each kind maps to its
handler once (handlers()) instead of a lookup by name per line.

Invariant: the block holds only lines since the last DONE (end_turn hands it over and starts a
new one; an engine's death drops it), so no turn gets another turn's figures.
"""
from collections.abc import Callable

from django.conf import settings

from engine_bridge import protocol as p
from engine_bridge.jobs import started_facts
from engine_bridge.telemetry import Publisher


class EngineTelemetry:
    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self.block: dict = {}  # telemetry lines since the last DONE (the block belongs to the next DONE)

    def handlers(self) -> dict[type, Callable]:
        """Event type -> handler, for the engine-wide telemetry lines."""
        return {p.Model: self.model, p.HwInfo: self.hwinfo, p.Tiers: self.tiers, p.Emap: self.emap,
                p.Hits: self.hits, p.Gpus: self.gpus, p.Entropy: self.entropy, p.Repin: self.repin,
                p.Prof: self.prof, p.SlotMem: self.slotmem}

    def ready(self, model_info: dict | None) -> None:
        """For an engine that sends no MODEL line (the real colibri binary), the served model's
        facts are what the bridge started it with; MODEL, when it comes, replaces them."""
        if model_info is None:
            self.publisher.update(model=started_facts())

    def reset(self) -> None:
        """The engine died: its unfinished turn's block goes with it."""
        self.block = {}

    def end_turn(self, ev: p.Done) -> dict:
        """The block of the turn this DONE ends; the turn's own figures go to the atlas."""
        block, self.block = self.block, {}
        self.publisher.add_turn({"hit_pct": ev.hit_pct, "tok_s": ev.tok_s, "completion_tokens": ev.emitted})
        return block

    def iostat(self, ev: p.IoStat) -> dict:
        """The latest turn's IOSTAT, engine-wide (/v1/stats, /ops); -> its figures for the request."""
        figures = ev.figures()
        self.publisher.update(iostat=figures)
        return figures

    def slotmem(self, ev: p.SlotMem) -> None:
        """A slot's memory after its turn (/ops): K/V, recurrent state and checkpoints, by slot."""
        self.publisher.update(slot_memory={**(self.publisher.state.get("slot_memory") or {}), str(ev.slot): ev.figures()})

    def model(self, ev: p.Model) -> None:
        """The MODEL line, with the model file it came from (`file`, unless the engine named one):
        the served id is that file's stem on every reader, not the reader's own ENGINE_MODEL."""
        self.publisher.update(model={**ev.info, "file": ev.info.get("file") or str(settings.ENGINE_MODEL)})

    def hwinfo(self, ev: p.HwInfo) -> None:
        self.block["hwinfo"] = ev.__dict__
        self.publisher.update(hwinfo=ev.__dict__)

    def tiers(self, ev: p.Tiers) -> None:
        self.publisher.update(tiers=ev.__dict__)

    def emap(self, ev: p.Emap) -> None:
        self.publisher.update(emap=ev.__dict__, seq=self.publisher.state["seq"] + 1)

    def hits(self, ev: p.Hits) -> None:
        self.publisher.update(hits=ev.__dict__, seq=self.publisher.state["seq"] + 1)

    def gpus(self, ev: p.Gpus) -> None:
        self.block["gpus"] = ev.gpus
        self.publisher.update(gpus=ev.gpus)

    def entropy(self, ev: p.Entropy) -> None:
        self.block["entropy"] = ev.values
        self.publisher.update(entropy=ev.values)

    def repin(self, ev: p.Repin) -> None:
        self.block.setdefault("repin", []).append(ev.__dict__)
        self.publisher.add_repin(ev.__dict__)

    def prof(self, ev: p.Prof) -> None:
        self.block["prof"] = ev.values
