"""A Python reading of a CGD1 wire grammar (engine_bridge.grammar.dfa_of), for the tests that
check the compiler's automata (tests/bridge/test_grammar_compiler.py) and the engine's token
masks against them (tests/native/test_grammar.py): the states, each state's byte distance to
acceptance, and stepping bytes through it."""
from __future__ import annotations

from engine_bridge.grammar import dfa_of


class RefDfa:
    def __init__(self, wire: bytes):
        self.start, self.accept, self.trans = dfa_of(wire)
        inf = float("inf")
        self.dist = [0 if a else inf for a in self.accept]  # fewest bytes to an accepting state
        changed = True
        while changed:
            changed = False
            for q, out in enumerate(self.trans):
                for _, _, t in out:
                    if self.dist[t] + 1 < self.dist[q]:
                        self.dist[q], changed = self.dist[t] + 1, True

    def run(self, q: int, data: bytes) -> int | None:
        """The state after `data` from q, or None where a byte has no transition."""
        for b in data:
            q = next((t for lo, hi, t in self.trans[q] if lo <= b <= hi), None)
            if q is None:
                return None
        return q

    def accepts(self, data: bytes) -> bool:
        q = self.run(self.start, data)
        return q is not None and self.accept[q]
