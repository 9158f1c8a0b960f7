// The operator's page (/ops, staff only): polls /ops/stats.json — the figures of /metrics and
// /v1/stats — and turns the cumulative counters into per-interval rates and means, drawn as
// small line charts (chart.ts) plus a live table of requests by surface and status.
import { formatValue, LineChart, PALETTE } from "./chart";
import { askedBridge, type BridgeEntry, HostPicker, withBridge } from "../hosts";
import { formatBytes, ioFigures, type TurnIo } from "./io";

interface Row {
  name: string;
  labels: Record<string, string>;
  value: number;
}

// The engine's memory budget split (MODEL's `memory`, native/README.md "Memory budget"), MiB.
interface MemorySplit {
  budget_mb: number; source: string; limit_mb: number; margin_mb: number; dense_mb: number; kv_mb: number;
  work_mb: number; experts_mb: number; experts_all_mb: number; experts_resident: boolean;
  expert_override: boolean; prefill_rows: number; prefill_chunk: number;
}

// Each slot's memory after its last turn (SLOTMEM; engine_bridge.protocol.SlotMem.figures), by slot.
interface SlotMemory {
  kv_bytes: number; state_bytes: number; checkpoints: number; total_bytes: number;
}

interface Stats {
  time: number;
  engine: { up: number; slots: number; busy: number; queue: number; restarts: number };
  io: TurnIo | null;
  memory?: MemorySplit | null;
  slot_memory?: Record<string, SlotMemory> | null;
  refusal?: string | null; // the engine refused its model file: why (the bridge waits for a new file)
  metrics: Record<string, Row[]>;
  bridge?: string; // whose engine figures `engine` and `io` are
  bridges?: BridgeEntry[];
}

function renderIo(io: TurnIo | null | undefined): void {
  const panel = document.getElementById("ops-io");
  if (!panel) return;
  panel.dataset.state = io ? "turn" : "none";
  const set = (id: string, text: string) => { document.getElementById(id)!.textContent = text; };
  const f = io ? ioFigures(io) : null;
  for (const k of ["disk", "ideal", "hit", "stall", "prefetch"] as const) set(`io-${k}`, f ? f[k] : "–");
  set("ops-io-turn", io ? `request ${io.id} · ${io.tokens} tokens · ${formatBytes(io.disk_bytes)} read, ${io.stall_s.toFixed(3)} s stalled` : "");
  set("ops-io-note", io ? "From the engine's IOSTAT line, one per turn: the latest finished turn, engine-wide."
    : "No IOSTAT from this engine yet: our engine sends one per turn; the real colibri engine never does.");
}

// MiB, the unit of MEM_BUDGET_MB and EXPERT_RAM_MB
const mib = (v: number) => `${v.toFixed(v < 10 ? 1 : 0)} MiB`;

function renderMemory(mem: MemorySplit | null | undefined): void {
  const panel = document.getElementById("ops-memory");
  if (!panel) return;
  panel.dataset.state = mem ? "split" : "none";
  const set = (id: string, text: string) => { document.getElementById(id)!.textContent = text; };
  set("mem-budget", mem ? mib(mem.budget_mb) : "–");
  set("mem-dense", mem ? mib(mem.dense_mb) : "–");
  set("mem-kv", mem ? mib(mem.kv_mb) : "–");
  set("mem-work", mem ? mib(mem.work_mb) : "–");
  set("mem-experts", !mem ? "–" : mem.experts_resident ? `${mib(mem.experts_mb)} (all)`
    : `${mib(mem.experts_mb)} of ${mib(mem.experts_all_mb)}${mem.expert_override ? " (EXPERT_RAM_MB)" : ""}`);
  set("mem-prefill", mem ? `${mem.prefill_rows} / ${mem.prefill_chunk}` : "–");
  set("ops-memory-source", !mem ? "" : mem.source === "MEM_BUDGET_MB" ? "set by MEM_BUDGET_MB"
    : `${mem.source} ${mib(mem.limit_mb)} less ${mib(mem.margin_mb)}`);
}

// The slots' memory now: K/V plus a hybrid's recurrent state and its checkpoints, summed.
function renderSlotMemory(slots: Record<string, SlotMemory> | null | undefined): void {
  const el = document.getElementById("mem-slots");
  if (!el) return;
  const all = Object.values(slots ?? {});
  if (!all.length) { el.textContent = "–"; return; }
  const sum = (k: keyof SlotMemory) => all.reduce((a, s) => a + s[k], 0);
  const state = sum("state_bytes");
  el.textContent = `${formatBytes(sum("total_bytes"))} in ${all.length} slot${all.length === 1 ? "" : "s"}`
    + (state ? ` (state ${formatBytes(state)}, ${sum("checkpoints")} checkpoints)` : "");
}

interface Boot {
  poll_s: number;
  stats_url: string;
  surfaces: string[];
}

const SURFACE_LABEL: Record<string, string> = {
  openai_chat: "Chat",
  openai_completion: "Completions",
  anthropic_messages: "Messages",
  openai_responses: "Responses",
};

// Sum of the samples called `name` whose labels include `match`.
function total(s: Stats, name: string, match: Record<string, string> = {}): number {
  let sum = 0;
  for (const rows of Object.values(s.metrics)) {
    for (const r of rows) {
      if (r.name !== name) continue;
      if (Object.entries(match).every(([k, v]) => r.labels[k] === v)) sum += r.value;
    }
  }
  return sum;
}

const rate = (prev: Stats, cur: Stats, dt: number, name: string, match: Record<string, string> = {}) =>
  Math.max(0, total(cur, name, match) - total(prev, name, match)) / dt;

// Mean of a histogram over the interval (Δsum / Δcount), null when it observed nothing.
function intervalMean(prev: Stats, cur: Stats, base: string, match: Record<string, string> = {}, scale = 1): number | null {
  const n = total(cur, `${base}_count`, match) - total(prev, `${base}_count`, match);
  if (n <= 0) return null;
  return ((total(cur, `${base}_sum`, match) - total(prev, `${base}_sum`, match)) / n) * scale;
}

function statusClass(status: string): string {
  if (status === "429") return "429";
  return `${status[0]}xx`;
}

interface ChartDef {
  id: string;
  chart: LineChart;
  compute: (prev: Stats, cur: Stats, dt: number) => (number | null)[];
}

function boot(): void {
  const bootEl = document.getElementById("ops-boot");
  const cfg: Boot = bootEl ? JSON.parse(bootEl.textContent || "{}") : { poll_s: 2, stats_url: "/ops/stats.json", surfaces: [] };
  const surfaces = cfg.surfaces;
  const grid = document.getElementById("ops-charts")!;
  const bySurface = surfaces.map((s, i) => ({ name: s, label: SURFACE_LABEL[s] ?? s, color: PALETTE[i % PALETTE.length] }));
  const charts: ChartDef[] = [];
  const add = (id: string, opts: ConstructorParameters<typeof LineChart>[2], compute: ChartDef["compute"]) =>
    charts.push({ id, chart: new LineChart(grid, id, opts), compute });

  add("requests", { title: "Requests by surface", unit: "req/s", series: bySurface, digits: 2 },
    (p, c, dt) => surfaces.map((s) => rate(p, c, dt, "colibri_api_requests_total", { surface: s })));
  add("statuses", {
    title: "Answers by status", unit: "req/s", digits: 2,
    series: ["2xx", "4xx", "429", "5xx"].map((n, i) => ({ name: n, label: n, color: [PALETTE[0], PALETTE[2], PALETTE[3], PALETTE[4]][i] })),
  }, (p, c, dt) => {
    const out: Record<string, number> = { "2xx": 0, "4xx": 0, "429": 0, "5xx": 0 };
    for (const r of c.metrics["colibri_api_requests"] ?? []) {
      if (r.name !== "colibri_api_requests_total") continue;
      const before = total(p, r.name, r.labels);
      const cls = statusClass(r.labels.status ?? "");
      if (cls in out) out[cls] += Math.max(0, r.value - before) / dt;
    }
    return ["2xx", "4xx", "429", "5xx"].map((k) => out[k]);
  });
  add("ttft", { title: "Time to first token (mean)", unit: "ms", series: bySurface, digits: 0 },
    (p, c) => surfaces.map((s) => intervalMean(p, c, "colibri_api_time_to_first_token_seconds", { surface: s }, 1000)));
  add("itl", { title: "Inter-token latency (mean)", unit: "ms", series: bySurface, digits: 1 },
    (p, c) => surfaces.map((s) => intervalMean(p, c, "colibri_api_inter_token_seconds", { surface: s }, 1000)));
  add("queue", { title: "Queue depth", unit: "jobs waiting", series: [{ name: "queue", label: "waiting", color: PALETTE[2] }], digits: 0 },
    (_p, c) => [c.engine.queue]);
  add("wait", { title: "Queue wait (mean)", unit: "ms", series: [{ name: "wait", label: "all surfaces", color: PALETTE[3] }], digits: 0 },
    (p, c) => [intervalMean(p, c, "colibri_api_queue_wait_seconds", {}, 1000)]);
  add("slots", { title: "Slot occupancy", unit: "% of KV slots busy", yMax: 100, series: [{ name: "busy", label: "busy", color: PALETTE[0] }], digits: 0 },
    (_p, c) => [c.engine.slots ? (100 * c.engine.busy) / c.engine.slots : null]);
  add("tokens", {
    title: "Tokens", unit: "tok/s", digits: 0,
    series: [{ name: "in", label: "in (prompt)", color: PALETTE[1] }, { name: "out", label: "out (generated)", color: PALETTE[0] }],
  }, (p, c, dt) => [rate(p, c, dt, "colibri_api_tokens_total", { direction: "in" }),
    rate(p, c, dt, "colibri_api_tokens_total", { direction: "out" })]);
  add("reuse", { title: "Prefix reuse", unit: "prompt tok/s kept from a cached prefix", digits: 0,
    series: [{ name: "reuse", label: "reused", color: PALETTE[1] }] },
  (p, c, dt) => [rate(p, c, dt, "colibri_api_prefix_reuse_tokens_total")]);
  add("hit", { title: "Expert hit % (mean)", unit: "% of routed experts resident", yMax: 100, digits: 1,
    series: [{ name: "hit", label: "hit %", color: PALETTE[0] }] },
  (p, c) => [intervalMean(p, c, "colibri_api_expert_hit_percent")]);
  add("io", { title: "Expert bytes per token (last turn)", unit: "MB per token", digits: 2,
    series: [{ name: "disk", label: "read from disk", color: PALETTE[4] }, { name: "ideal", label: "ideal (selected experts)", color: PALETTE[1] }] },
  (_p, c) => [c.io?.disk_bytes_per_token ?? null, c.io?.ideal_bytes_per_token ?? null].map((v) => (v === null ? null : v / 1e6)));
  add("restarts", { title: "Engine restarts", unit: "since the bridge started", digits: 0,
    series: [{ name: "restarts", label: "restarts", color: PALETTE[4] }, { name: "up", label: "engine up (1/0)", color: PALETTE[5] }] },
  (_p, c) => [c.engine.restarts, c.engine.up]);

  const engineEl = document.getElementById("ops-engine")!;
  const slotsEl = document.getElementById("ops-slots")!;
  const updatedEl = document.getElementById("ops-updated")!;
  const table = document.getElementById("ops-status-table") as HTMLTableElement;
  const totalEl = document.getElementById("ops-requests-total")!;
  let prev: Stats | null = null;
  const hosts = new HostPicker(document.getElementById("ops-host")!);
  const statsUrl = withBridge(cfg.stats_url, askedBridge());

  function renderTable(s: Stats): void {
    const rows = (s.metrics["colibri_api_requests"] ?? []).filter((r) => r.name === "colibri_api_requests_total");
    const statuses = [...new Set(rows.map((r) => r.labels.status))].sort();
    const head = document.createElement("tr");
    head.append(...["surface", ...statuses, "total"].map((t) => {
      const th = document.createElement("th");
      th.textContent = t;
      return th;
    }));
    table.tHead!.replaceChildren(head);
    const body = surfaces.map((surface) => {
      const tr = document.createElement("tr");
      tr.dataset.surface = surface;
      const cells = statuses.map((st) => total(s, "colibri_api_requests_total", { surface, status: st }));
      const values = [SURFACE_LABEL[surface] ?? surface, ...cells.map((v) => formatValue(v, 0)),
        formatValue(cells.reduce((a, b) => a + b, 0), 0)];
      tr.append(...values.map((v, i) => {
        const td = document.createElement("td");
        td.textContent = v;
        if (i === values.length - 1) td.className = "ops-total";
        return td;
      }));
      return tr;
    });
    table.tBodies[0].replaceChildren(...body);
    const all = total(s, "colibri_api_requests_total");
    totalEl.textContent = `${formatValue(all, 0)} in all`;
    totalEl.dataset.total = String(all);
  }

  async function poll(): Promise<void> {
    try {
      const r = await fetch(statsUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (r.status === 401) {
        window.location.assign(`/accounts/login/?next=${encodeURIComponent(window.location.pathname)}`);
        return;
      }
      if (!r.ok) {
        const body = (await r.json().catch(() => null)) as { error?: string } | null;
        throw new Error(body?.error ?? `HTTP ${r.status}`);
      }
      const cur = (await r.json()) as Stats;
      if (cur.bridge) hosts.set(cur.bridges ?? [], cur.bridge);
      engineEl.textContent = cur.engine.up ? "engine up" : cur.refusal ? `model refused: ${cur.refusal}` : "engine down";
      engineEl.dataset.state = cur.engine.up ? "up" : cur.refusal ? "refused" : "down";
      slotsEl.textContent = `${cur.engine.busy}/${cur.engine.slots} slots busy · ${cur.engine.queue} waiting`;
      renderTable(cur);
      renderIo(cur.io);
      renderMemory(cur.memory);
      renderSlotMemory(cur.slot_memory);
      if (prev && cur.time > prev.time) {
        const dt = cur.time - prev.time;
        for (const def of charts) def.chart.push(cur.time, def.compute(prev, cur, dt));
      }
      prev = cur;
      updatedEl.textContent = `updated ${new Date(cur.time * 1000).toLocaleTimeString()}`;
      updatedEl.dataset.state = "live";
    } catch (err) {
      updatedEl.textContent = `no figures: ${(err as Error).message}`;
      updatedEl.dataset.state = "error";
    }
    for (const def of charts) def.chart.draw();
  }

  window.addEventListener("resize", () => charts.forEach((d) => d.chart.draw()));
  void poll();
  window.setInterval(() => void poll(), Math.max(1, cfg.poll_s) * 1000);
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
else boot();
