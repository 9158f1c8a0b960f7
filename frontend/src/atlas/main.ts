// Entry point of the atlas page (templates/experts/atlas.html): wires the socket to the grid,
// the panels, the card, the map and the library. Everything is pushed; nothing polls.
import { AtlasHttp, AtlasSocket } from "./client";
import { fillCard } from "./card";
import { tierOf } from "./emap";
import { GridView } from "./grid";
import { Library } from "./library";
import { MapView } from "./map";
import { addRepins, renderEntropy, renderLegend, renderSeries } from "./panels";
import { HostPicker } from "../hosts";
import { ioFigures } from "../ops/io";
import type { AtlasDoc, AtlasInfo, MessageRouting, PhaseRouting, ServerFrame, TelemetryFields, TiersInfo } from "./types";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const SERIES_KEEP = 120;

interface Debug { grid: GridView; frames: () => number; hitFrames: number; lastHitAt: number; lastHitWall: number; lastHitCells: number[]; doc: () => AtlasDoc | null; routing: () => MessageRouting | null; phase: () => string | null }
declare global { interface Window { colibriAtlas?: Debug } }

export function mount(): void {
  const boot = JSON.parse($("atlas-boot").textContent || "{}") as { csrf_token: string };
  const http = new AtlasHttp(boot.csrf_token);
  const grid = new GridView($<HTMLCanvasElement>("atlas-grid"));
  const map = new MapView($<HTMLCanvasElement>("atlas-map"), $("map-legend"));
  const card = $("atlas-card");
  let doc: AtlasDoc | null = null;
  let tiers: TiersInfo | null = null;
  let entropy: number[] | null = null;
  let totalWindows = 0;
  const residentShare: number[] = [];
  const engineHit: number[] = [];  // DONE's hit_pct per turn, once the telemetry carries it
  function plotHitRate(): void {
    const series = engineHit.length ? engineHit : residentShare;
    renderSeries($<HTMLCanvasElement>("atlas-hitrate"), series);
    if (series.length) $("hitrate-now").textContent = `${series[series.length - 1].toFixed(0)} %`;
  }
  const repinned = new Set<number>();
  let routing: MessageRouting | null = null;
  let phase: string | null = null;   // the part of the message's turn shown (null: all of it)
  const debug: Debug = { grid, frames: () => grid.frames, hitFrames: 0, lastHitAt: 0, lastHitWall: 0, lastHitCells: [], doc: () => doc, routing: () => routing, phase: () => phase };
  window.colibriAtlas = debug;

  const library = new Library(http, (cur: AtlasInfo | null) => void loadAtlas(cur));
  // The atlas's document and map are set together, then #atlas-current is marked with the id
  // loaded: its text changes first, when the list is read, and a reader of the page waits for the mark.
  async function loadAtlas(cur: AtlasInfo | null): Promise<void> {
    const [nextDoc, nextMap] = cur ? await Promise.all([http.doc(cur.id), http.map(cur.id)])
      : [null, { categories: [], points: [] }];
    doc = nextDoc;
    map.set(nextMap);
    search();
    $("atlas-current").dataset.loaded = cur ? String(cur.id) : "none";
  }

  function search(): void {
    const keys = map.search($<HTMLInputElement>("atlas-search").value, doc);
    if (!keys) return grid.setHighlight(null);
    const cells = new Set<number>();
    const rowOf = new Map(grid.layers.map((l, r) => [l, r]));
    for (const key of keys) {
      const [layer, expert] = key.split(":").map(Number);
      const r = rowOf.get(layer);
      if (r !== undefined && expert < grid.cols) cells.add(r * grid.cols + expert);
    }
    $("search-count").textContent = `${keys.size} experts`;
    grid.setHighlight(cells);
  }
  $<HTMLInputElement>("atlas-search").addEventListener("input", search);

  // ?message=<id> (the chat's "expert hits" link): the experts that answered that message,
  // with their selection counts; everything else dimmed until the filter is cleared.
  const filterBox = $("atlas-filter");
  function showIo(r: MessageRouting | null): void {
    const el = $("filter-io");
    el.hidden = !r?.io;
    if (!r?.io) return;
    const f = ioFigures(r.io);
    el.textContent = `Its turn's expert I/O (${r.io.tokens} tokens): ${f.disk} read from disk per token · ideal ${f.ideal} · `
      + `hit ${f.hit} · stall ${f.stall} per token · prefetch ${f.prefetch}`;
  }
  // With the engine's per-token routing the turn splits into prompt / thinking / answer: one
  // button per phase shows that phase's experts alone, and a line says which experts fired only
  // while thinking, only while answering, or in both.
  function showPhases(r: MessageRouting | null): void {
    const box = $("filter-phases"), overlap = $("filter-overlap");
    const phases = r?.phases ?? null;
    box.replaceChildren();
    box.hidden = !phases;
    overlap.hidden = true;
    if (!r || !phases) return;
    const add = (name: string | null, text: string) => {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "btn";
      b.dataset.phase = name ?? "all";
      b.textContent = text;
      b.setAttribute("aria-pressed", String(phase === name));
      b.addEventListener("click", () => { phase = name; applyFilter(); });
      box.append(b);
    };
    add(null, `whole turn · ${r.experts} experts`);
    for (const [name, p] of Object.entries(phases)) add(name, `${name} · ${p.positions} tokens · ${p.experts} experts`);
    const think = phases.thinking, answer = phases.answer;
    if (!think || !answer) return;
    const cells = (p: PhaseRouting) => new Set(p.counts.map(([row, e]) => row * r.cols + e));
    const t = cells(think), a = cells(answer);
    const both = [...t].filter((c) => a.has(c)).length;
    overlap.textContent = `Experts only while thinking: ${t.size - both} · only while answering: ${a.size - both} · in both: ${both}`;
    overlap.hidden = false;
  }
  function applyFilter(): void {
    showIo(routing);
    showPhases(routing);
    if (!routing) { grid.setFilter(null); filterBox.hidden = true; return; }
    const r = routing;
    const part = phase !== null ? r.phases?.[phase] ?? null : null;
    filterBox.hidden = false;
    if (!grid.rows) { $("filter-text").textContent = `message ${r.message}: ${r.experts} experts (waiting for the expert map)`; return; }
    if (r.rows !== grid.rows || r.cols !== grid.cols) {
      grid.setFilter(null);
      $("filter-text").textContent = `message ${r.message}: ${r.experts} experts, on a ${r.rows} × ${r.cols} map; the engine now has ${grid.rows} × ${grid.cols}`;
      return;
    }
    grid.setFilter(new Map((part ?? r).counts.map(([row, e, c]) => [row * grid.cols + e, c])));
    $("filter-text").textContent = part
      ? `message ${r.message} · ${phase}: ${part.experts} experts · ${part.selections} selections over ${part.positions} tokens`
      : `message ${r.message}: ${r.experts} experts · ${r.selections} selections`;
  }
  async function loadFilter(): Promise<void> {
    const id = Number(new URLSearchParams(location.search).get("message"));
    if (!Number.isInteger(id) || id <= 0) return;
    filterBox.hidden = false;
    phase = null;
    $("filter-text").textContent = `message ${id}: loading…`;
    try {
      routing = await http.routing(id);
    } catch (e) {
      $("filter-text").textContent = `message ${id}: ${(e as Error).message}`;
      return;
    }
    applyFilter();
  }
  $("filter-clear").addEventListener("click", () => {
    routing = null;
    phase = null;
    const url = new URL(location.href);
    url.searchParams.delete("message");
    history.replaceState(null, "", url.pathname + url.search);
    applyFilter();
  });

  function showCard(row: number, col: number, x: number, y: number): void {
    const i = row * grid.cols + col, layer = grid.layerOf(row);
    fillCard(card, {
      layer, expert: col, byte: grid.emap[i], windows: grid.windows[i], totalWindows,
      pinnedByRepin: repinned.has(i), entry: doc?.experts[`${layer}:${col}`] ?? null, hasAtlas: doc !== null,
      message: routing && grid.filter ? { id: routing.message, count: grid.filter.get(i) ?? 0 } : undefined,
    });
    card.style.left = `${x + 14}px`;
    card.style.top = `${y + 14}px`;
  }
  const canvas = $<HTMLCanvasElement>("atlas-grid");
  const pointer = (e: MouseEvent) => {
    const r = canvas.getBoundingClientRect();
    const cell = grid.cellAt(e.clientX - r.left, e.clientY - r.top);
    if (cell) showCard(cell.row, cell.col, e.clientX - r.left, e.clientY - r.top);
    else if (e.type === "mousemove") card.hidden = true;
  };
  canvas.addEventListener("mousemove", pointer);
  canvas.addEventListener("click", pointer);
  canvas.addEventListener("mouseleave", () => { card.hidden = true; });
  $<HTMLCanvasElement>("atlas-map").addEventListener("click", (e) => {
    const r = (e.target as HTMLElement).getBoundingClientRect();
    const key = map.pointAt(e.clientX - r.left, e.clientY - r.top);
    if (!key) return;
    const [layer, expert] = key.split(":").map(Number);
    const row = grid.layers.indexOf(layer);
    $("map-picked").textContent = `${key}: ${doc?.experts[key]?.label ?? ""}`;
    if (row >= 0) showCard(row, expert, grid.cellCentre(row, expert).x, grid.cellCentre(row, expert).y);
  });

  function apply(f: TelemetryFields): void {
    if (f.layers) grid.setLayers(f.layers);
    if (f.layer_source) $("layer-source").textContent = `layer numbers from: ${f.layer_source}`;
    if (f.emap) {
      const reshaped = f.emap.rows !== grid.rows || f.emap.cols !== grid.cols;
      grid.setMap(f.emap.rows, f.emap.cols, f.emap.hex);
      if (reshaped && routing) applyFilter();
    }
    if (f.tiers !== undefined) tiers = f.tiers;
    if (f.emap || f.tiers !== undefined) renderLegend($("atlas-legend"), grid.emap, tiers);
    if (f.entropy !== undefined) { entropy = f.entropy; renderEntropy($<HTMLCanvasElement>("atlas-entropy"), entropy, grid.cols, grid.layers); }
    if (f.hits && f.hits.hex) {
      const cells = grid.hit(f.hits.rows, f.hits.cols, f.hits.hex);
      if (cells.length) {
        totalWindows += f.windows ?? 1;
        debug.hitFrames++;
        debug.lastHitAt = performance.now();
        debug.lastHitWall = Date.now();
        debug.lastHitCells = cells;
        const resident = cells.filter((i) => tierOf(grid.emap[i]) > 0).length;
        residentShare.push((100 * resident) / cells.length);
        residentShare.splice(0, Math.max(0, residentShare.length - SERIES_KEEP));
        plotHitRate();
      }
    }
    const hits = (f.turns ?? []).map((t) => t.hit_pct).filter((v): v is number => typeof v === "number" && Number.isFinite(v));
    if (hits.length) {
      if (!engineHit.length) {
        $("hitrate-title").textContent = "Expert cache hit % per turn";
        $("hitrate-note").textContent = "The engine's own figure for each finished turn (DONE's hit_pct), engine-wide over the turn's window.";
      }
      engineHit.push(...hits);
      engineHit.splice(0, Math.max(0, engineHit.length - SERIES_KEEP));
      plotHitRate();
    }
    if (f.repin && f.repin.length) {
      // REPIN names the absolute layer (as the usage file does), not the EMAP row.
      for (const e of f.repin) {
        const row = grid.layers.length === grid.rows ? grid.layers.indexOf(e.layer) : e.layer;
        if (row >= 0 && row < grid.rows) repinned.add(row * grid.cols + e.expert);
      }
      addRepins($("atlas-repin"), f.repin);
    }
    if (f.status !== undefined || f.up !== undefined) $("engine-state").textContent = `engine ${f.status ?? (f.up ? "up" : "down")}`;
    if (f.busy !== undefined) $("engine-busy").textContent = `${f.busy} busy`;
  }

  const hosts = new HostPicker($("atlas-host"));
  const socket = new AtlasSocket((frame: ServerFrame) => {
    if (frame.type === "snapshot") {
      if (frame.bridge) hosts.set(frame.bridges, frame.bridge);
      // The snapshot is the state before the page opened: no flashes (its hits are dropped), and
      // no REPIN history in the timeline (it would be stamped with the load time; the server
      // declares none, and a snapshot that carried some is still read without), only changes
      // that arrive from now on.
      apply({ ...frame, hits: undefined, repin: undefined });
      if (!frame.emap || !frame.emap.rows) $("engine-state").textContent = "no expert map (engine down or dense model)";
    } else if (frame.type === "telemetry") apply(frame);
    else if (frame.type === "build") library.showBuild(frame.build);
    else if (frame.type === "atlas") void library.refresh();
    else if (frame.type === "error") $("engine-state").textContent = frame.detail;
  }, (s) => { $("socket-state").textContent = s; $("socket-state").dataset.state = s; });
  socket.connect();
  void loadFilter();
  void library.refresh();
  void library.loadBuilds();
  window.addEventListener("resize", () => { grid.resize(); map.draw(); renderEntropy($<HTMLCanvasElement>("atlas-entropy"), entropy, grid.cols, grid.layers); });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mount);
else mount();
