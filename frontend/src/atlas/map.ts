// The map: every expert of the atlas at its server-side 2-D projection (PCA of affinity
// vectors), coloured by its top category; a search highlights the experts that know a topic.
import type { AtlasDoc, MapData } from "./types";

const PALETTE = ["#0f766e", "#b42318", "#1d4ed8", "#9a6700", "#7c3aed", "#be185d", "#15803d",
  "#c2410c", "#0e7490", "#4d7c0f", "#6b21a8", "#334155"];
const PAD = 10;

export class MapView {
  data: MapData | null = null;
  matches: Set<string> | null = null;
  private colour = new Map<string, string>();

  constructor(private canvas: HTMLCanvasElement, private legend: HTMLElement) {}

  set(data: MapData): void {
    this.data = data;
    this.colour = new Map(data.categories.map((c, i) => [c, PALETTE[i % PALETTE.length]]));
    this.legend.replaceChildren(...data.categories.map((c) => {
      const s = document.createElement("span");
      s.className = "legend-item";
      const sw = document.createElement("i");
      sw.style.background = this.colour.get(c)!;
      s.append(sw, c);
      return s;
    }));
    this.draw();
  }

  // Experts whose affinity for a category matching the query is at least `min`, or whose top
  // category matches. Returns the matching keys ("layer:expert").
  search(query: string, doc: AtlasDoc | null, min = 0.25): Set<string> | null {
    const q = query.trim().toLowerCase();
    if (!q || !doc) { this.matches = null; this.draw(); return null; }
    const cats = doc.categories.filter((c) => c.toLowerCase().includes(q));
    const found = new Set<string>();
    for (const [key, e] of Object.entries(doc.experts))
      if (cats.includes(e.top) || cats.some((c) => (e.affinity[c] ?? 0) >= min)) found.add(key);
    this.matches = found;
    this.draw();
    return found;
  }

  private xy(x: number, y: number, w: number, h: number): [number, number] {
    return [PAD + ((x + 1) / 2) * (w - 2 * PAD), PAD + ((1 - y) / 2) * (h - 2 * PAD)];
  }

  pointAt(px: number, py: number): string | null {
    if (!this.data) return null;
    const w = this.canvas.clientWidth, h = this.canvas.clientHeight;
    let best: string | null = null, bestD = 36;
    for (const [key, x, y] of this.data.points) {
      const [cx, cy] = this.xy(x, y, w, h);
      const d = (cx - px) ** 2 + (cy - py) ** 2;
      if (d < bestD) { bestD = d; best = key; }
    }
    return best;
  }

  draw(): void {
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 400, h = c.clientHeight || 300;
    c.width = w * dpr;
    c.height = h * dpr;
    const ctx = c.getContext("2d")!;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    if (!this.data || !this.data.points.length) {
      ctx.fillStyle = "#6b7078";
      ctx.font = "12px sans-serif";
      ctx.fillText("no atlas yet: import one or build it", 12, h / 2);
      return;
    }
    const m = this.matches;
    for (const [key, x, y, top] of this.data.points) {
      const [cx, cy] = this.xy(x, y, w, h);
      ctx.globalAlpha = m && !m.has(key) ? 0.12 : 0.85;
      ctx.fillStyle = this.colour.get(top) ?? "#334155";
      const size = m && m.has(key) ? 8 : 6;
      ctx.fillRect(cx - size / 2, cy - size / 2, size, size);
    }
    ctx.globalAlpha = 1;
  }
}
