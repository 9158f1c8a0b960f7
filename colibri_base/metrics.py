"""The operator's view: `GET /metrics` (Prometheus text, prometheus-client) and its JSON mirror
`GET /v1/stats`.

Two sources. Web-side figures are prometheus-client metrics updated where requests are served
(api/views.py): requests by surface and status, time to first token, inter-token latency, queue
wait, tokens in and out, prompt tokens the engine kept from a reused KV prefix (ACCEPT reused=N),
and the expert hit % of each generation (its done stats: routed experts already resident). Bridge-side figures (engine up, slots, busy slots, queue depth, engine
restarts, the last turn's expert I/O from our engine's IOSTAT) live in the bridge's telemetry in
Redis and are read at scrape time by BridgeCollector,
so every web process reports the same values without the bridge exporting anything.

Layering: this module imports neither api/ nor engine_bridge/ (colibri_base's rule). The surface
labels are the API's (api.surfaces declares them with declare_surfaces at import), and the bridge's
state is read by a function the caller hands in (stats / exposition / registry take
engine_bridge.telemetry.get_state from api.views and ops.views).

Multiprocess: with PROMETHEUS_MULTIPROC_DIR set (several Daphne workers), each process writes
its samples there and a scrape aggregates them (prometheus_client.multiprocess); without it, the
process's own registry is served. Names: underscores only, counters end in _total, the label
sets are fixed (every surface pre-created, so a series exists from the first scrape).
"""
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

BridgeState = Callable[[], dict]  # engine_bridge.telemetry.get_state: the bridge's telemetry dict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)

REQUESTS = Counter("colibri_api_requests", "API requests by surface and HTTP status", ["surface", "status"])
OUTCOMES = Counter("colibri_api_generations", "Generations the engine accepted, by how they ended",
                   ["surface", "outcome"])
TTFT = Histogram("colibri_api_time_to_first_token_seconds", "Request received -> first token sent",
                 ["surface"], buckets=LATENCY_BUCKETS)
INTER_TOKEN = Histogram("colibri_api_inter_token_seconds", "Gap between consecutive text deltas",
                        ["surface"], buckets=TOKEN_GAP_BUCKETS)
QUEUE_WAIT = Histogram("colibri_api_queue_wait_seconds", "Request received -> the engine accepted it",
                       ["surface"], buckets=LATENCY_BUCKETS)
TOKENS = Counter("colibri_api_tokens", "Tokens in (prompt) and out (completion)", ["surface", "direction"])
PREFIX_REUSE = Counter("colibri_api_prefix_reuse_tokens", "Prompt tokens the engine kept from a reused KV prefix",
                       ["surface"])
EXPERT_HIT = Histogram("colibri_api_expert_hit_percent", "Per generation: % of routed experts already resident",
                       ["surface"], buckets=(10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 100))

SURFACES: list[str] = []  # the wire surfaces' labels, one per api.surfaces row (declare_surfaces)


def declare_surfaces(names: Iterable[str]) -> None:
    """Adds the surfaces' labels and pre-creates each one's series, so that a series exists from
    the first scrape. Idempotent: a name declared twice is kept once."""
    for surface in names:
        if surface in SURFACES:
            continue
        SURFACES.append(surface)
        REQUESTS.labels(surface, "200")
        for outcome in ("completed", "length", "failed", "cancelled"):
            OUTCOMES.labels(surface, outcome)
        for direction in ("in", "out"):
            TOKENS.labels(surface, direction)
        TTFT.labels(surface)
        INTER_TOKEN.labels(surface)
        QUEUE_WAIT.labels(surface)
        PREFIX_REUSE.labels(surface)
        EXPERT_HIT.labels(surface)


IO_GAUGES = (("tokens", "tokens"), ("disk_bytes", "disk_bytes"), ("ideal_bytes", "ideal_bytes"),
             ("hits", "expert_hits"), ("acquisitions", "expert_acquisitions"), ("stall_s", "stall_seconds"),
             ("prefetch_issued", "prefetch_issued"), ("prefetch_used", "prefetch_used"))


class BridgeCollector:
    """The bridge's telemetry (read_state(): engine_bridge.telemetry.get_state) as metrics, read
    per scrape; `state` keeps what the last scrape read (stats() takes the last turn's I/O figures
    from it)."""

    state: dict | None = None

    def __init__(self, read_state: BridgeState) -> None:
        self.read_state = read_state

    def collect(self) -> Iterator[Metric]:
        try:
            state = self.read_state()
        except Exception:  # Redis down: report the engine as not up, nothing else
            state = {"updated": None}
        self.state = state
        bridge = state.get("updated") is not None
        up = GaugeMetricFamily("colibri_engine_up", "1 when the engine is up (the bridge reports it)")
        up.add_metric([], 1.0 if bridge and state.get("up") else 0.0)
        yield up
        running = GaugeMetricFamily("colibri_bridge_running", "1 when a bridge worker publishes its state")
        running.add_metric([], 1.0 if bridge else 0.0)
        yield running
        for name, key, text in (("colibri_engine_slots", "slots", "KV slots of the engine"),
                                ("colibri_engine_busy_slots", "busy", "KV slots generating now"),
                                ("colibri_queue_depth", "queue", "Jobs waiting for a slot")):
            g = GaugeMetricFamily(name, text)
            g.add_metric([], float(state.get(key) or 0))
            yield g
        restarts = CounterMetricFamily("colibri_engine_restarts", "Engine restarts since the bridge started")
        restarts.add_metric([], float(state.get("restarts") or 0))
        yield restarts
        io = state.get("iostat") if bridge else None
        if io:  # our engine's IOSTAT of the last finished turn (absent for engines that send none)
            for key, name in IO_GAUGES:
                g = GaugeMetricFamily(f"colibri_engine_last_turn_{name}", f"Last finished turn: IOSTAT {key}")
                g.add_metric([], float(io[key]))
                yield g


def registry(bridge: BridgeCollector) -> CollectorRegistry:
    """The registry a scrape reads: every process's samples (multiprocess) or this process's, and
    the bridge's figures."""
    reg = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(reg)
    else:
        reg.register(_Local())
    reg.register(bridge)
    return reg


class _Local:
    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def exposition(read_bridge_state: BridgeState) -> bytes:
    """/metrics: Prometheus text of registry()."""
    return generate_latest(registry(BridgeCollector(read_bridge_state)))


def stats(read_bridge_state: BridgeState) -> dict:
    """/v1/stats: a summary per surface and of the engine for humans, then every sample of
    /metrics for scripts ({family: [{name, labels, value}]}; histograms as _count / _sum)."""
    families: dict[str, list[dict]] = {}
    samples: dict[tuple[str, tuple], float] = {}
    bridge = BridgeCollector(read_bridge_state)
    for family in registry(bridge).collect():
        if family.name.startswith(("python_", "process_")):
            continue
        rows: list[dict[str, Any]] = [{"name": x.name, "labels": x.labels, "value": x.value} for x in family.samples
                if not x.name.endswith(("_bucket", "_created"))]
        if rows:
            families[family.name] = rows
            for row in rows:
                samples[(row["name"], tuple(sorted(row["labels"].items())))] = row["value"]
    return {"surfaces": {surface: _surface_summary(samples, surface) for surface in SURFACES},
            "engine": {name: samples.get((f"colibri_{metric}", ()), 0) for name, metric in (
                ("up", "engine_up"), ("slots", "engine_slots"), ("busy", "engine_busy_slots"),
                ("queue", "queue_depth"), ("restarts", "engine_restarts_total"))},
            # The last finished turn's expert I/O (protocol.IoStat.figures: disk and ideal bytes per
            # token, hit %, stall ms per token, prefetch accuracy); null unless our engine sends IOSTAT.
            "io": (bridge.state or {}).get("iostat") if (bridge.state or {}).get("updated") is not None else None,
            # How the engine split its memory budget (the MODEL line's `memory`, native/README.md
            # "Memory budget"); null unless our engine described itself.
            "memory": _memory_split(bridge.state),
            # Each slot's memory after its last turn (protocol.SlotMem.figures: K/V, a hybrid's
            # recurrent state with its checkpoints); null unless our engine sends SLOTMEM.
            "slot_memory": (bridge.state or {}).get("slot_memory") if (bridge.state or {}).get("updated") is not None else None,
            # The engine's reason for refusing its model file (the bridge then does not restart it
            # until the file changes); null otherwise.
            "refusal": (bridge.state or {}).get("refused") if (bridge.state or {}).get("status") == "refused" else None,
            "metrics": families}


def _memory_split(state: dict | None) -> dict | None:
    if not state or state.get("updated") is None:
        return None
    model = state.get("model")
    memory = model.get("memory") if isinstance(model, dict) else None
    return memory if isinstance(memory, dict) else None


def _surface_summary(samples: dict[tuple[str, tuple], float], surface: str) -> dict:
    def total(name: str, **match: str) -> float:
        return sum(v for (n, labels), v in samples.items() if n == name and ("surface", surface) in labels
                   and all((k, val) in labels for k, val in match.items()))

    def mean(name: str) -> float | None:
        count = total(f"{name}_count")
        return round(total(f"{name}_sum") / count, 4) if count else None

    requests = total("colibri_api_requests_total")
    ok = sum(v for (n, labels), v in samples.items() if n == "colibri_api_requests_total"
             and ("surface", surface) in labels and dict(labels)["status"].startswith("2"))
    return {"requests": requests, "errors": requests - ok,
            "tokens_in": total("colibri_api_tokens_total", direction="in"),
            "tokens_out": total("colibri_api_tokens_total", direction="out"),
            "time_to_first_token_avg_s": mean("colibri_api_time_to_first_token_seconds"),
            "inter_token_avg_s": mean("colibri_api_inter_token_seconds"),
            "queue_wait_avg_s": mean("colibri_api_queue_wait_seconds"),
            "prefix_reuse_tokens": total("colibri_api_prefix_reuse_tokens_total"),
            "expert_hit_pct_avg": mean("colibri_api_expert_hit_percent")}
