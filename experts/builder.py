"""The atlas builder: probe prompts through the bridge, per-probe expert counts, experts.json.

Two ways of measuring, chosen by what the engine takes (routes_supported):

**routes** (our engine: it announces itself with a MODEL line and takes the routes=1 / heat=0
SUBMIT keys, docs/contracts.md "Routing per request"). Each probe is one request, the whole
text, max_tokens 1, greedy, heat=False: its done event carries the engine's ROUTES, the exact
number of times each expert was selected for this request's positions (engine-side, per
request, also inside a batched step), so other traffic cannot leak in and nothing needs to be
retried for it. A "selection" is one token routed to the expert. heat=False keeps the probes out
of the engine's usage heat (EMAP heat, usage file, pinning). ROUTES counts only the positions the
turn prefilled, so a probe must reuse no KV: a reset request ("|", heat=False) on the build's
slot goes first, and a probe that reused any KV anyway (it landed on another slot) is run again.

**hits** (engines without our extensions, e.g. the real colibri binary; kept as it was):
* Counts come from HITS, the engine-wide bitmap of experts routed at least once since the
  previous HITS. Mid-turn HITS fall every 6 tokens of an engine-wide counter, so their windows
  shift with whatever else the engine generated before: they cannot give reproducible counts.
  What is reproducible is the union of all HITS of one request (everything it routed, the
  previous request's turn-end HITS having cleared the bitmap). So each probe is fed as a series
  of requests, each its text up to the next chunk_words words (probes.json), max_tokens 1, on one slot: the
  engine reuses the previous chunk's KV and prefills only the new words. A "selection" below is
  one chunk in which the expert was routed (at least once), not one token.
* A request's HITS are the telemetry items (engine_bridge.telemetry pushes each one, numbered)
  between its start (a `busy` update) and its release (busy back to 0), and its turn block must
  carry the ENTROPY its DONE carries. Another request running meanwhile (busy > 1), a lost item
  (gap in n), a bridge restart, or a slot taken over between chunks (less KV reused than the
  previous chunk's prompt) makes the probe contaminated: it is run again, later.
* Reproducible: probes are raw text, greedy (temperature 0, fixed seed), on the build's slot
  (its conversation key), which a reset request clears before each probe (its first chunk must
  reuse no KV). Same model + same probes -> same counts -> same bytes (atlas_format.dump).
* Probes go at background priority: a person's chat is always served first. On such an engine
  they add to its cumulative usage heat (.coli_usage): it takes no heat=0.

Computation (colibri's analyze.py as peers.md §4 describes it): per run, an expert's share = its
count / all counts of the run; average the shares over the runs of each category; renormalise ->
affinity; entropy in bits; spec = 1 - H/ln C; specialist iff spec >= 0.5; only experts with
>= MIN_COUNT selections that fire in >= MIN_RUNS runs of their top category are written.
"""
import asyncio
import contextlib
import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from colibri_base.layers import channel_layer
from engine_bridge import client as bridge_client
from engine_bridge import telemetry
from engine_bridge.request import GenerationRequest

PROBES_FILE = Path(__file__).parent / "data" / "probes.json"
MIN_COUNT = 30
MIN_RUNS = 2
SPECIALIST = 0.5
SEED = 1
RESET_PROMPT = "|"            # no probe starts with it, so no probe shares a KV prefix with it
MAX_ATTEMPTS = 20
RETRY_WAIT_S = 0.25           # doubled after each contaminated attempt, up to RETRY_WAIT_MAX_S
RETRY_WAIT_MAX_S = 30.0
RELEASE_TIMEOUT_S = 10.0


class BuildError(Exception):
    pass


class BuildCancelled(Exception):
    pass


@dataclass(frozen=True)
class Probe:
    category: str
    index: int
    text: str


def chunks(text: str, words: int) -> list[str]:
    """Prefixes of text ending after every `words`-th word, and text itself. Cut just after a word
    (never inside the whitespace that follows), so a prefix tokenizes as the start of the next."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    cuts = [ends[i] for i in range(words - 1, len(ends), words)]
    if not cuts or cuts[-1] != len(text):
        cuts.append(len(text))
    return [text[:c] for c in cuts]


def load_probes(path: Path | str = PROBES_FILE) -> tuple[list[Probe], int, str]:
    """(probes in run order, words per chunk, digest). Run order interleaves the categories, so two
    consecutive probes never come from the same category."""
    raw = Path(path).read_bytes()
    spec = json.loads(raw)
    cats = spec["categories"]
    rounds = max(len(v) for v in cats.values())
    probes = [Probe(c, i, cats[c][i]) for i in range(rounds) for c in cats if i < len(cats[c])]
    return probes, int(spec.get("chunk_words", 4)), hashlib.sha256(raw).hexdigest()


def load_probe_experts(path: Path | str = PROBES_FILE) -> int | None:
    """The routed experts per token the probes ask for (probes.json "experts"), or None."""
    value = json.loads(Path(path).read_bytes()).get("experts")
    return int(value) if value else None


def routes_supported(model: object) -> bool:
    """Whether the engine reports per-request routing (routes=1) and takes heat=0: our engine,
    which sends a MODEL line. Without one the bridge's telemetry says extensions: false."""
    return isinstance(model, dict) and model.get("extensions", True) is not False


def routing_counts(routing: dict[str, Any]) -> np.ndarray:
    """The done event's routing ({"rows", "cols", "counts": [[row, expert, n], ...]}) as an
    array of shape (rows, cols)."""
    counts = np.zeros((routing["rows"], routing["cols"]), dtype=np.int64)
    for row, expert, n in routing["counts"]:
        counts[row, expert] += n
    return counts


# How many routed experts per token the probes use when probes.json does not say (probe_count).
# Measured on the default model (top-15 of 16, routes method, native/README.md has the model):
# probing at 15 gave 0 specialists (leave-one-prompt-out 29/30), at 4 0 (30/30), at 2 4 (29/30).
# At 15 of 16 every expert is selected for ~94 % of every topic's tokens: its shares differ by
# topic only in which single expert a token leaves out, so no expert can reach spec >= 0.5 and
# the label, the map and the search have nothing to show. The router's first choices can.
CROWDED_SHARE = 0.25   # a default count above this share of the experts is "crowded"
FIRST_CHOICES = 8      # ... then probe at n_experts / 8 (2 of 16), at least experts_min


def probe_count(model: dict[str, Any] | None) -> int | None:
    """The experts=N the probes ask for by default: None (the model's own count) unless the model
    routes more than CROWDED_SHARE of its experts per token, then n_experts // FIRST_CHOICES."""
    model = model or {}
    top_k, n = model.get("top_k") or 0, model.get("n_experts") or 0
    if not top_k or not n or top_k <= CROWDED_SHARE * n:
        return None
    return max(model.get("experts_min") or 1, n // FIRST_CHOICES)


def probe_experts(wanted: int | None, model: dict[str, Any] | None) -> int | None:
    """`wanted` when the engine takes experts=N in that range (its MODEL line says), else None:
    engines without the extension route probes with the model's own top-k."""
    model = model or {}
    low, high = model.get("experts_min") or 0, model.get("experts_max") or 0
    return wanted if wanted and low <= wanted <= high else None


# --- computation (pure) ------------------------------------------------------------------------

def hits_counts(hexes: Iterable[str], rows: int, cols: int) -> np.ndarray:
    """Per-expert number of HITS bitmaps (hex, LSB-first) in which it is set: shape (rows, cols)."""
    cells = rows * cols
    total = np.zeros(cells, dtype=np.int64)
    for hx in hexes:
        bits = np.unpackbits(np.frombuffer(bytes.fromhex(hx), dtype=np.uint8), bitorder="little")
        total += bits[:cells]
    return total.reshape(rows, cols)


def _shares(counts: np.ndarray) -> np.ndarray:
    s = counts.sum()
    return counts / s if s else np.zeros_like(counts, dtype=float)


def compute_atlas(runs: Iterable[tuple[str, Any]], categories: Sequence[str], layers: Sequence[int]) -> dict[str, Any]:
    """runs: [(category, counts (rows, cols))]; layers: absolute layer index per row.
    Returns the experts.json document (dict, in key order (layer, expert))."""
    shares: dict[str, list[np.ndarray]] = {c: [] for c in categories}
    totals: np.ndarray | None = None
    fired: dict[str, np.ndarray | None] = {c: None for c in categories}
    for cat, counts in runs:
        counts = np.asarray(counts, dtype=float)
        shares[cat].append(_shares(counts))
        totals = counts if totals is None else totals + counts
        f = (counts > 0).astype(int)
        seen = fired[cat]
        fired[cat] = f if seen is None else seen + f
    if totals is None:
        raise BuildError("no probe ran")
    rows, cols = totals.shape
    mean = np.stack([np.mean(shares[c], axis=0) if shares[c] else np.zeros((rows, cols)) for c in categories], axis=-1)
    n_cat = len(categories)
    experts = {}
    for r in range(rows):
        for e in range(cols):
            vec = mean[r, e]
            if totals[r, e] < MIN_COUNT or vec.sum() <= 0:
                continue
            p = vec / vec.sum()
            top_i = int(np.argmax(p))
            top = categories[top_i]
            top_fired = fired[top]
            if top_fired is None or top_fired[r, e] < MIN_RUNS:
                continue
            nz = p[p > 0]
            h_bits = float(-(nz * np.log2(nz)).sum())
            spec = 1.0 - float(-(nz * np.log(nz)).sum()) / math.log(n_cat) if n_cat > 1 else 1.0
            affinity = {c: round(float(v), 4) for c, v in zip(categories, p) if round(float(v), 4) != 0}
            experts[f"{layers[r]}:{e}"] = {
                "affinity": affinity,
                "entropy": round(h_bits, 2) if h_bits > 0 else -0.0,
                "top": top,
                "label": f"specialist: {top}" if spec >= SPECIALIST else "generalist",
            }
    return {"categories": list(categories), "experts": experts}


def leave_one_out(runs: Iterable[tuple[str, Any]], categories: Sequence[str]) -> dict[str, Any]:
    """Leave-one-prompt-out: each run is classified by the category whose mean share profile
    (from the other runs) is closest in cosine to its own, both centred on the other runs' mean.
    Returns {"correct", "total", "accuracy"}."""
    vectors = [(cat, _shares(np.asarray(c, dtype=float)).ravel()) for cat, c in runs]
    correct = 0
    for i, (cat, v) in enumerate(vectors):
        rest = [(c, w) for j, (c, w) in enumerate(vectors) if j != i]
        centre = np.mean([w for _, w in rest], axis=0)
        best, best_score = None, -np.inf
        for c in categories:
            members = [w for cc, w in rest if cc == c]
            if not members:
                continue
            profile = np.mean(members, axis=0) - centre
            x = v - centre
            denom = np.linalg.norm(profile) * np.linalg.norm(x)
            score = float(profile @ x / denom) if denom else -np.inf
            if score > best_score:
                best, best_score = c, score
        correct += best == cat
    total = len(vectors)
    return {"correct": int(correct), "total": total, "accuracy": round(correct / total, 4) if total else 0.0}


# --- running the probes (async, through the bridge) ----------------------------------------------

async def probe_generate(request: GenerationRequest) -> tuple[dict, dict]:
    """One probe through the bridge -> (its accepted event or {}, its done event); BuildError
    when the engine refuses it."""
    accepted: dict | None = None
    final: dict | None = None
    async with contextlib.aclosing(bridge_client.generate(request)) as events:
        async for event in events:
            if event is None:  # only a stream with a tick yields None
                continue
            if event["kind"] == "accepted":
                accepted = event
            elif event["kind"] in ("done", "error"):
                final = event
    if final is None or final["kind"] == "error":
        raise BuildError(f"the engine refused a probe: {(final or {}).get('message', 'no answer')}")
    return accepted or {}, final


class RoutesRunner:
    """Runs probes one at a time through the bridge with routes=True, heat=False and returns each
    one's exact selection counts (see the module docstring)."""

    method = "routes"

    def __init__(self, *, key: str, experts: int | None = None, model: str | None = None) -> None:
        self.key = key
        self.experts = experts
        self.model = model  # the served id the probes ask for (its bridge), None: the default model

    async def __aenter__(self) -> "RoutesRunner":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def _generate(self, prompt: str, routes: bool) -> tuple[dict, dict]:
        return await probe_generate(GenerationRequest(
            prompt=prompt, max_tokens=1, temperature=0.0, seed=SEED, conversation_key=self.key,
            priority="background", experts=self.experts, routes=routes, heat=False, model=self.model))

    async def run(self, probe: Probe) -> np.ndarray | None:
        """The probe's selection counts, shape (rows, cols); None when it reused KV (run again)."""
        await self._generate(RESET_PROMPT, routes=False)
        accepted, final = await self._generate(probe.text, routes=True)
        if accepted.get("reused"):
            return None
        routing = final.get("routing")
        if not routing or not routing.get("rows"):
            raise BuildError("the engine sent no routing for a probe (routes=1 unsupported, or a dense model)")
        return routing_counts(routing)


class ProbeRunner:
    """Runs probes one at a time and returns each one's HITS bitmaps (see the module docstring)."""

    method = "hits"

    def __init__(self, *, key: str, chunk_words: int, experts: int | None = None, model: str | None = None,
                 bridges: frozenset[str] | None = None) -> None:
        self.key = key
        self.chunk_words = chunk_words
        self.experts = experts  # routed experts per token for the probes (None: the model's own)
        self.model = model      # the served id the probes ask for, None: the default model
        # The telemetry group carries every bridge's items: another model's would read as a gap.
        self.bridges = bridges  # the bridges serving `model` (None: take every bridge's)
        self.layer = channel_layer()
        self.channel = f"atlas-probe.{uuid.uuid4().hex}"  # a plain channel: its own BZPOPMIN key
        self.inbox: asyncio.Queue[tuple[str | None, dict]] = asyncio.Queue()
        self.receiver: asyncio.Task[None] | None = None
        self.last: tuple[str | None, Any] | None = None  # (boot, n) of the last item seen

    async def __aenter__(self) -> "ProbeRunner":
        await self.layer.group_add(telemetry.GROUP, self.channel)
        self.receiver = asyncio.create_task(self._pump())
        # The bridge sends to the group only once it has seen a member (it asks every
        # WATCH_CHECK_S): the first probe's items must not fall in that gap.
        await asyncio.sleep(telemetry.WATCH_CHECK_S + telemetry.PUSH_MIN_INTERVAL)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.receiver is not None:
            self.receiver.cancel()  # nothing after the build matters, so a lost message is harmless
            await asyncio.gather(self.receiver, return_exceptions=True)
        await self.layer.group_discard(telemetry.GROUP, self.channel)

    async def _pump(self) -> None:
        while True:
            message = await self.layer.receive(self.channel)
            if self.bridges is not None and message.get("bridge") not in self.bridges:
                continue
            for item in message.get("items", ()):
                self.inbox.put_nowait((message.get("boot"), item))

    async def _generate(self, prompt: str, max_tokens: int) -> tuple[dict, dict]:
        return await probe_generate(GenerationRequest(
            prompt=prompt, max_tokens=max_tokens, temperature=0.0, seed=SEED,
            conversation_key=self.key, priority="background", experts=self.experts, model=self.model))

    def drain(self) -> None:
        """Forget items that arrived before the next request (called before each probe)."""
        while not self.inbox.empty():
            boot, item = self.inbox.get_nowait()
            self.last = (boot, item.get("n"))

    async def _request(self, prompt: str, max_tokens: int) -> tuple[list[tuple[int, int, str]], bool, dict]:
        """Runs one request and consumes its telemetry items, from its start (busy >= 1) to its
        release (busy == 0 after it). Returns (HITS [(rows, cols, hex)], clean, accepted)."""
        task = asyncio.create_task(self._generate(prompt, max_tokens))
        hexes: list[tuple[int, int, str]] = []
        started, clean, released, waited, entropy = False, True, False, 0.0, None
        try:
            while not released:
                try:
                    boot, item = await asyncio.wait_for(self.inbox.get(), 1.0)
                except asyncio.TimeoutError:
                    if task.done() and not clean:
                        break  # another request ran alongside: no need to wait for its end
                    if task.done():
                        if task.exception() is not None:
                            break
                        waited += 1.0
                        if waited >= RELEASE_TIMEOUT_S:
                            clean = False  # the release item was lost
                            break
                    continue
                if self.last is not None and (boot != self.last[0] or item.get("n") != self.last[1] + 1):
                    clean = False
                self.last = (boot, item.get("n"))
                busy = item.get("busy")
                if not started:
                    if busy is not None and busy >= 1:
                        started, clean = True, clean and busy == 1
                    continue
                if busy is not None and busy > 1:
                    clean = False
                if "entropy" in item:
                    entropy = item["entropy"]
                if item.get("hits") and item["hits"].get("hex"):
                    hits = item["hits"]
                    hexes.append((hits["rows"], hits["cols"], hits["hex"]))
                released = busy == 0
                if task.done() and not clean:
                    break
        finally:
            accepted, final = await task
        # The span is ours only if its turn block carried our DONE's ENTROPY: another request may
        # have started and ended between our submit and our start (engines that send no ENTROPY
        # cannot be checked this way).
        if final.get("entropy") is not None and entropy != final["entropy"]:
            clean = False
        return hexes, clean and started and released, accepted

    async def run(self, probe: Probe) -> np.ndarray | None:
        """The probe's counts, shape (rows, cols): in how many of its chunks each expert was
        routed. None when the probe was contaminated (run it again later)."""
        bitmaps = await self.bitmaps(probe)
        if bitmaps is None:
            return None
        rows, cols = bitmaps[-1][0], bitmaps[-1][1]
        return hits_counts([h for _, _, h in bitmaps], rows, cols)

    async def bitmaps(self, probe: Probe) -> list[tuple[int, int, str]] | None:
        """One HITS bitmap (hex) per chunk of the probe: everything that chunk's request routed.
        None when the probe was contaminated (run it again later)."""
        self.drain()
        await self._request(RESET_PROMPT, 1)
        bitmaps: list[tuple[int, int, str]] = []
        previous = None
        for prefix in chunks(probe.text, self.chunk_words):
            hexes, clean, accepted = await self._request(prefix, 1)
            reused = accepted.get("reused") or 0
            if previous is None and reused:
                raise BuildError(f"probe {probe.category}/{probe.index} shares {reused} KV tokens "
                                 f"with the reset prompt")
            if not clean or not hexes or (previous is not None and reused < previous - 1):
                return None
            previous = accepted.get("prompt_tokens") or 0
            union = 0
            for _, _, hx in hexes:
                union |= int(hx, 16)
            bitmaps.append((hexes[-1][0], hexes[-1][1], format(union, f"0{len(hexes[-1][2])}x")))
        return bitmaps
