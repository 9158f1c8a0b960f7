// Everything around the grid: the tier legend, per-layer entropy, resident share of routed
// experts over time, the REPIN timeline. Small canvases and a short list; no per-cell DOM.
import { tierOf, TIER_NAMES, TIER_RGB } from "./emap";
import type { Repin, TiersInfo } from "./types";

const css = (rgb: [number, number, number]) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;

export function renderLegend(el: HTMLElement, emap: Uint8Array, tiers: TiersInfo | null | undefined): void {
  const counts = [0, 0, 0];
  for (const b of emap) counts[tierOf(b)]++;
  const perExpert = tiers && tiers.ram_experts ? tiers.ram_gb / tiers.ram_experts : null;
  const bytes = [
    tiers ? `${tiers.vram_gb.toFixed(2)} GB` : "–",
    tiers ? `${tiers.ram_gb.toFixed(2)} GB` : "–",
    perExpert !== null ? `≈ ${(perExpert * counts[0]).toFixed(2)} GB` : "–",
  ];
  el.replaceChildren(...[2, 1, 0].map((t) => {
    const item = document.createElement("span");
    item.className = "legend-item";
    item.dataset.tier = TIER_NAMES[t];
    const sw = document.createElement("i");
    sw.style.background = css(TIER_RGB[t]);
    item.append(sw, `${TIER_NAMES[t]}: ${counts[t]} experts · ${bytes[2 - t] ?? "–"}`);
    return item;
  }));
}

function setupCanvas(c: HTMLCanvasElement): CanvasRenderingContext2D {
  const dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth || 320, h = c.clientHeight || 120;
  c.width = w * dpr;
  c.height = h * dpr;
  const ctx = c.getContext("2d")!;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return ctx;
}

const ENTROPY_LABEL_H = 14;
const SERIES_DOTS_MAX = 40;

// Bars: one per MoE layer, height = routing entropy in bits (max log2 of the experts per layer).
export function renderEntropy(c: HTMLCanvasElement, values: number[] | null | undefined, cols: number, layers: number[]): void {
  const ctx = setupCanvas(c);
  const w = c.clientWidth || 320, h = c.clientHeight || 120;
  if (!values || !values.length) {
    ctx.fillStyle = "#6b7078";
    ctx.font = "12px sans-serif";
    ctx.fillText("no ENTROPY from the engine yet", 8, h / 2);
    return;
  }
  const max = Math.max(Math.log2(Math.max(cols, 2)), ...values);
  const bw = w / values.length;
  ctx.fillStyle = "#0f766e";
  // Bars between the axis labels (bottom 12 px) and the scale label (top LABEL_H px): a layer at
  // the maximum, which near-uniform routing is, would otherwise paint over "max … bits".
  values.forEach((v, i) => {
    const bh = (v / max) * (h - 12 - ENTROPY_LABEL_H);
    ctx.fillRect(i * bw + 0.5, h - 12 - bh, Math.max(1, bw - 1), bh);
  });
  ctx.fillStyle = "#6b7078";
  ctx.font = "10px monospace";
  ctx.fillText(`L${layers[0] ?? 0}`, 0, h - 2);
  ctx.fillText(`L${layers[values.length - 1] ?? values.length - 1}`, w - 30, h - 2);
  ctx.fillText(`max ${max.toFixed(1)} bits`, w - 80, 10);
}

// A line of the last points (0-100 %), each point a dot while there are few (one finished turn
// is one point, and a line of one point paints nothing), the newest always.
export function renderSeries(c: HTMLCanvasElement, points: number[]): void {
  const ctx = setupCanvas(c);
  const w = c.clientWidth || 320, h = c.clientHeight || 120;
  ctx.strokeStyle = "#e3e3de";
  ctx.beginPath();
  ctx.moveTo(0, h / 2); ctx.lineTo(w, h / 2);
  ctx.stroke();
  if (!points.length) return;
  const x = (i: number) => (points.length === 1 ? w - 3 : 3 + (i / (points.length - 1)) * (w - 6));
  const y = (p: number) => h - 3 - (p / 100) * (h - 6);
  ctx.strokeStyle = ctx.fillStyle = "#0f766e";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach((p, i) => (i === 0 ? ctx.moveTo(x(i), y(p)) : ctx.lineTo(x(i), y(p))));
  ctx.stroke();
  points.forEach((p, i) => {
    if (points.length > SERIES_DOTS_MAX && i < points.length - 1) return;
    ctx.beginPath();
    ctx.arc(x(i), y(p), 2.5, 0, 2 * Math.PI);
    ctx.fill();
  });
}

// Entries as they arrive (the page never lists the snapshot's older ones): stamped with the time
// they reached the page, labelled with the engine's absolute layer.
export function addRepins(list: HTMLElement, entries: Repin[]): void {
  const now = new Date().toLocaleTimeString();
  for (const e of entries) {
    const li = document.createElement("li");
    const from = TIER_NAMES[e.old_tier] ?? String(e.old_tier);
    li.textContent = `${now} · L${e.layer} #${e.expert}: ${from} → re-pinned${e.gpu ? ` (gpu ${e.gpu})` : ""}`;
    list.prepend(li);
  }
  while (list.children.length > 64) list.lastElementChild!.remove();
}
