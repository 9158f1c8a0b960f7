// Entry point of the atlas page (templates/experts/atlas.html): wires the socket to the grid,
// the panels, the card, the map and the library. Everything is pushed; nothing polls.
import { AtlasHttp, AtlasSocket } from "./client";
import { fillCard } from "./card";
import { tierOf } from "./emap";
import { GridView } from "./grid";
import { Library } from "./library";
import { MapView } from "./map";
import { addRepins, renderEntropy, renderLegend, renderSeries } from "./panels";
import type { AtlasDoc, AtlasInfo, ServerFrame, TelemetryFrame, TiersInfo } from "./types";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const SERIES_KEEP = 120;

interface Debug { grid: GridView; frames: () => number; hitFrames: number; lastHitAt: number; lastHitWall: number; lastHitCells: number[]; doc: () => AtlasDoc | null }
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
  const repinned = new Set<number>();
  const debug: Debug = { grid, frames: () => grid.frames, hitFrames: 0, lastHitAt: 0, lastHitWall: 0, lastHitCells: [], doc: () => doc };
  window.colibriAtlas = debug;

  const library = new Library(http, (cur: AtlasInfo | null) => void loadAtlas(cur));
  async function loadAtlas(cur: AtlasInfo | null): Promise<void> {
    doc = cur ? await http.doc(cur.id) : null;
    map.set(cur ? await http.map(cur.id) : { categories: [], points: [] });
    search();
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

  function showCard(row: number, col: number, x: number, y: number): void {
    const i = row * grid.cols + col, layer = grid.layerOf(row);
    fillCard(card, {
      layer, expert: col, byte: grid.emap[i], windows: grid.windows[i], totalWindows,
      pinnedByRepin: repinned.has(i), entry: doc?.experts[`${layer}:${col}`] ?? null, hasAtlas: doc !== null,
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

  function apply(f: TelemetryFrame): void {
    if (f.layers) grid.setLayers(f.layers);
    if (f.layer_source) $("layer-source").textContent = `layer numbers from: ${f.layer_source}`;
    if (f.emap) grid.setMap(f.emap.rows, f.emap.cols, f.emap.hex);
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
        renderSeries($<HTMLCanvasElement>("atlas-hitrate"), residentShare);
        $("hitrate-now").textContent = `${residentShare[residentShare.length - 1].toFixed(0)} %`;
      }
    }
    if (f.repin && f.repin.length) {
      for (const e of f.repin) repinned.add(e.layer * grid.cols + e.expert);
      addRepins($("atlas-repin"), f.repin, (r) => grid.layerOf(r));
    }
    if (f.status !== undefined || f.up !== undefined) $("engine-state").textContent = `engine ${f.status ?? (f.up ? "up" : "down")}`;
    if (f.busy !== undefined) $("engine-busy").textContent = `${f.busy} busy`;
  }

  const socket = new AtlasSocket((frame: ServerFrame) => {
    if (frame.type === "snapshot") {
      apply({ ...frame, hits: null });
      if (!frame.emap || !frame.emap.rows) $("engine-state").textContent = "no expert map (engine down or dense model)";
    } else if (frame.type === "telemetry") apply(frame);
    else if (frame.type === "build") library.showBuild(frame.build);
    else if (frame.type === "atlas") void library.refresh();
  }, (s) => { $("socket-state").textContent = s; $("socket-state").dataset.state = s; });
  socket.connect();
  void library.refresh();
  void library.loadBuilds();
  window.addEventListener("resize", () => { grid.resize(); map.draw(); renderEntropy($<HTMLCanvasElement>("atlas-entropy"), entropy, grid.cols, grid.layers); });
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", mount);
else mount();
