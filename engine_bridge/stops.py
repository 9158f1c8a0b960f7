"""Client stop strings, matched in time linear in the text: one Aho–Corasick automaton per request.

Why: the bridge matches every stream's stop strings on the one event loop that relays every
stream. The former check (for each stop, each prefix length, `text.endswith(stop[:n])`) cost
about count × length² character steps per token: 1,000 stop strings of 1,000 characters took
seconds per token, every other stream and the bridge's heartbeat stalled behind it, and /health
answered 503 (issue 25 item 5). Here each decoded character costs O(1) amortised steps, whatever
the list, and building the automaton costs O(total stop length) once per request.

Semantics (the former ones, which tests compare against `naive_scan`): text arrives in chunks;
after each chunk the matcher reports
* the earliest-starting occurrence of any stop string that ends inside the chunk (ties: the
  shorter string, i.e. the one that ends first), as (start index, the stop string), or None;
* `held`: the length of the longest suffix of the text so far that is a proper prefix of a stop
  string (the text a stream must hold back: it may still grow into a stop).
Invariant: `held` is the depth of the automaton's state, so it never exceeds the longest stop.
"""
from collections import deque
from collections.abc import Iterable


class StopMatcher:
    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = list(stops)
        self.goto: list[dict[str, int]] = [{}]  # node -> {char: node}
        self.fail = [0]
        self.depth = [0]
        self.word: list[str | None] = [None]     # the stop string that ends exactly at this node
        self.longest: list[str | None] = [None]  # the longest stop string that is a suffix of this node's string
        for stop in self.stops:
            self._add(stop)
        self._links()
        self.node = 0
        self.pos = 0           # characters fed so far

    def _add(self, stop: str) -> None:
        node = 0
        for ch in stop:
            nxt = self.goto[node].get(ch)
            if nxt is None:
                nxt = len(self.goto)
                self.goto[node][ch] = nxt
                self.goto.append({})
                self.fail.append(0)
                self.depth.append(self.depth[node] + 1)
                self.word.append(None)
                self.longest.append(None)
            node = nxt
        if stop:
            self.word[node] = stop

    def _links(self) -> None:
        queue: deque[int] = deque()
        for child in self.goto[0].values():
            queue.append(child)
            self.longest[child] = self.word[child]
        while queue:
            node = queue.popleft()
            for ch, child in self.goto[node].items():
                f = self.fail[node]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                link = self.goto[f].get(ch, 0)
                self.fail[child] = link if link != child else 0
                self.longest[child] = self.word[child] or self.longest[self.fail[child]]
                queue.append(child)

    @property
    def held(self) -> int:
        return self.depth[self.node]

    def feed(self, chunk: str) -> tuple[int, str] | None:
        """Feeds the next characters; -> (start, stop) of the earliest occurrence ending in
        them, or None. After a match the caller stops feeding (the stream is cut there)."""
        best: tuple[int, str] | None = None
        goto, fail, longest = self.goto, self.fail, self.longest
        node, pos = self.node, self.pos
        for ch in chunk:
            while node and ch not in goto[node]:
                node = fail[node]
            node = goto[node].get(ch, 0)
            pos += 1
            word = longest[node]
            if word is not None:
                start = pos - len(word)
                if best is None or start < best[0]:
                    best = (start, word)
        self.node, self.pos = node, pos
        return best


def naive_scan(text: str, fed: int, stops: Iterable[str]) -> tuple[tuple[int, str] | None, int]:
    """The former rule, for tests: (earliest occurrence ending after `fed` characters, held)."""
    hits = [(i, s) for s in stops if (i := text.find(s, max(0, fed - len(s) + 1))) >= 0 and i + len(s) > fed]
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return (min(hits) if hits else None), hold
