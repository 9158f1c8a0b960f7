"""A turn's expert routing split by phase: the prompt's prefill, the thinking, the answer.

The engine reports the whole turn's selection counts (ROUTES) and, asked with routes=2, the
selections of each generated token it forwards (ROUTESTEP, right after that token's DATA). The
engine does not know where a reasoning model's thinking ends; the bridge's splitter does
(engine_bridge.reasoning), so the bridge labels each DATA token with its phase and adds the next
ROUTESTEP to that phase. What ROUTES counts beyond the steps is the leg's prefill.

Attribution: a position's selections belong to the token at that position. Prompt positions are
the prompt (those the turn prefilled; a reused KV prefix is not counted, as in ROUTES); a
generated token is thinking when the splitter counted it as a reasoning token (the same rule as
done.reasoning_tokens), else answer; the last generated token is never forwarded and counts
nowhere. A thinking budget's continuation leg prefills the close of the thinking (and the
tokens the first leg sampled but did not forward): that prefill counts as thinking.

Invariant: when phases are reported, they add up cell by cell to the turn's counts. An engine
that does not announce routes=2 (MODEL "routes") sends no steps: the turn then has no phases,
only today's summary.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import TypedDict

from engine_bridge import protocol as p

log = logging.getLogger(__name__)

PROMPT, THINKING, ANSWER = "prompt", "thinking", "answer"
PHASES = (PROMPT, THINKING, ANSWER)

Triples = list[list[int]]  # [[row, expert, count], ...], nonzero, by row then expert


class Routing(TypedDict, total=False):
    """done.routing (docs/contracts.md): the turn's counts; `phases` and `positions` only when the
    engine sent per-token steps (thinking only for a reasoning job)."""
    rows: int
    cols: int
    counts: Triples
    phases: dict[str, Triples]
    positions: dict[str, int]  # positions forwarded per phase


def triples(cells: list[int], cols: int) -> Triples:
    return [[i // cols, i % cols, n] for i, n in enumerate(cells) if n]


class PhaseRouting:
    """One request's routing over its legs (a thinking budget adds one)."""

    def __init__(self, reasoning: bool) -> None:
        self.reasoning = reasoning
        self.rows = self.cols = 0
        self.total: list[int] | None = None
        self.cells: dict[str, list[int]] = {}
        self.positions = dict.fromkeys(PHASES, 0)
        self.steps = True          # every leg so far asked for steps
        self.legs = 0
        self.broken = False        # the steps did not fit the counts: no phases
        self._base: list[int] = []
        self._leg_start()

    def _leg_start(self) -> None:
        self.pending: deque[str] = deque()  # phases of this leg's tokens whose step has not come
        self.last = THINKING if self.legs and self.reasoning else ANSWER
        self.leg_steps: dict[str, list[int]] = {}
        self.leg_positions = dict.fromkeys(PHASES, 0)
        self.leg_prefilled = 0

    def leg(self, steps: bool) -> None:
        """A leg is submitted; `steps`: it asked for ROUTESTEP lines (routes=2)."""
        if self.legs:
            self._leg_start()
        self.legs += 1
        self.steps = self.steps and steps

    def accept(self, prompt_tokens: int, reused: int | None) -> None:
        """The leg's ACCEPT: the positions its prefill forwards."""
        self.leg_prefilled = prompt_tokens - (reused or 0)

    def token(self, phase: str | None) -> None:
        """A DATA token of the running leg; None: the bridge dropped it (after a stop or the
        thinking budget), it belongs where the token before it did."""
        self.last = phase or self.last
        self.pending.append(self.last)

    def step(self, ev: p.RouteStep) -> None:
        """The selections of the oldest generated token not yet routed."""
        if not self._shape(ev.rows, ev.cols):
            return
        if not self.pending:
            log.error("ROUTESTEP for id %s without a token before it", ev.id)
            self.broken = True
            return
        phase = self.pending.popleft()
        cells = self.leg_steps.setdefault(phase, [0] * (self.rows * self.cols))
        if len(self._base) != len(ev.picks):  # each pick's row offset, made once per request
            self._base = [row * self.cols for row in range(ev.rows) for _ in range(ev.k)]
        for base, expert in zip(self._base, ev.picks):
            cells[base + expert] += 1
        self.leg_positions[phase] += 1

    def routes(self, ev: p.Routes) -> None:
        """A leg's ROUTES: its counts join the turn's; what its steps do not explain is its prefill."""
        if not self._shape(ev.rows, ev.cols):
            return
        n = self.rows * self.cols
        leg = [0] * n
        for row, expert, count in ev.counts:
            leg[row * self.cols + expert] += count
        self.total = leg if self.total is None else [a + b for a, b in zip(self.total, leg)]
        prefill = leg
        for phase, cells in self.leg_steps.items():
            prefill = [a - b for a, b in zip(prefill, cells)]
            self._add(phase, cells)
            self.positions[phase] += self.leg_positions[phase]
        if min(prefill, default=0) < 0:
            log.error("ROUTESTEP lines of id %s count more than its ROUTES", ev.id)
            self.broken = True
        phase = THINKING if self.legs > 1 and self.reasoning else PROMPT
        self._add(phase, prefill)
        self.positions[phase] += self.leg_prefilled
        self.leg_steps = {}

    def _add(self, phase: str, cells: list[int]) -> None:
        have = self.cells.get(phase)
        self.cells[phase] = list(cells) if have is None else [a + b for a, b in zip(have, cells)]

    def _shape(self, rows: int, cols: int) -> bool:
        if not self.rows and not self.cols:
            self.rows, self.cols = rows, cols
        if (rows, cols) != (self.rows, self.cols):
            log.error("routing of one request changed shape: %sx%s, then %sx%s", self.rows, self.cols, rows, cols)
            self.broken = True
        return not self.broken

    def summary(self) -> Routing | None:
        """done.routing: None without a ROUTES line."""
        if self.total is None:
            return None
        out: Routing = {"rows": self.rows, "cols": self.cols, "counts": triples(self.total, self.cols)}
        if self.steps and not self.broken:
            names = PHASES if self.reasoning else (PROMPT, ANSWER)
            out["phases"] = {ph: triples(self.cells.get(ph) or [], self.cols) for ph in names}
            out["positions"] = {ph: self.positions[ph] for ph in names}
        return out
