// A small time-series line chart on a canvas: a few series, a rolling window of points, a zero
// baseline, three grid lines with labels, and a DOM legend that shows each series' latest value.
// No chart library; no inline style attributes (colours are set through the CSSOM, which the
// site's CSP allows). A null value is a gap (e.g. a mean over an interval with no samples).

export interface Series {
  name: string;
  label: string;
  color: string;
}

export interface ChartOptions {
  title: string;
  unit: string;            // shown after values: "req/s", "ms", "%", …
  series: Series[];
  yMax?: number;           // fixed top (e.g. 100 for percentages); otherwise from the data
  digits?: number;         // decimals in the legend
  windowS?: number;        // seconds of history drawn (default 300)
}

interface Point {
  t: number;               // seconds (server clock)
  v: (number | null)[];
}

export const PALETTE = ["#0f766e", "#2563eb", "#b45309", "#7c3aed", "#b42318", "#6b7078"];

function niceMax(v: number): number {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

export function formatValue(v: number | null | undefined, digits = 1): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  if (Math.abs(v) >= 10000) return `${(v / 1000).toFixed(1)}k`;
  return v.toFixed(digits);
}

export class LineChart {
  readonly panel: HTMLElement;
  readonly canvas: HTMLCanvasElement;
  private readonly values: HTMLElement[] = [];
  private points: Point[] = [];
  private draws = 0;

  constructor(parent: HTMLElement, readonly id: string, readonly opts: ChartOptions) {
    this.panel = document.createElement("div");
    this.panel.className = "panel ops-chart";
    this.panel.id = `chart-${id}`;
    const head = document.createElement("h2");
    head.textContent = opts.title;
    const unit = document.createElement("span");
    unit.className = "muted";
    unit.textContent = ` ${opts.unit}`;
    head.append(unit);
    this.canvas = document.createElement("canvas");
    this.canvas.className = "chart ops-canvas";
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", opts.title);
    const legend = document.createElement("div");
    legend.className = "legend";
    for (const s of opts.series) {
      const item = document.createElement("span");
      item.className = "legend-item";
      item.dataset.series = s.name;
      const sw = document.createElement("i");
      sw.style.background = s.color;
      const value = document.createElement("b");
      value.className = "ops-value";
      value.textContent = "–";
      item.append(sw, `${s.label} `, value);
      legend.append(item);
      this.values.push(value);
    }
    this.panel.append(head, this.canvas, legend);
    parent.append(this.panel);
  }

  push(t: number, v: (number | null)[]): void {
    this.points.push({ t, v });
    const horizon = t - (this.opts.windowS ?? 300);
    while (this.points.length > 2 && this.points[0].t < horizon) this.points.shift();
    this.opts.series.forEach((_, i) => {
      this.values[i].textContent = formatValue(v[i], this.opts.digits ?? 1);
    });
    this.canvas.dataset.points = String(this.points.length);
    this.canvas.dataset.last = JSON.stringify(v);
  }

  draw(): void {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth || 320, h = c.clientHeight || 140;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const ctx = c.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const left = 42, right = 6, top = 6, bottom = 16;
    const pw = w - left - right, ph = h - top - bottom;
    let top_ = this.opts.yMax ?? 0;
    if (this.opts.yMax === undefined) {
      for (const p of this.points) for (const v of p.v) if (v !== null && v > top_) top_ = v;
      top_ = niceMax(top_ * 1.1);
    }
    // Grid and labels
    ctx.font = "10px ui-monospace, monospace";
    ctx.fillStyle = "#6b7078";
    ctx.strokeStyle = "#e3e3de";
    ctx.lineWidth = 1;
    for (let i = 0; i <= 3; i++) {
      const y = top + ph - (ph * i) / 3;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y) + 0.5);
      ctx.lineTo(left + pw, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(formatValue((top_ * i) / 3, top_ >= 30 ? 0 : top_ >= 3 ? 1 : 2), 2, y + 3);
    }
    const windowS = this.opts.windowS ?? 300;
    ctx.fillText(`−${Math.round(windowS / 60)} min`, left, h - 3);
    ctx.fillText("now", left + pw - 18, h - 3);
    if (!this.points.length) {
      ctx.fillText("waiting for the first figures…", left + 8, top + ph / 2);
      return;
    }
    const t1 = this.points[this.points.length - 1].t, t0 = t1 - windowS;
    const x = (t: number) => left + ((t - t0) / windowS) * pw;
    const y = (v: number) => top + ph - (Math.min(v, top_) / top_) * ph;
    this.opts.series.forEach((s, i) => {
      ctx.strokeStyle = s.color;
      ctx.fillStyle = s.color;
      ctx.lineWidth = 1.6;
      ctx.beginPath();
      let pen = false, lone: Point | null = null, run = 0;
      for (const p of this.points) {
        const v = p.v[i];
        if (v === null || v === undefined || !Number.isFinite(v)) {
          if (run === 1 && lone) ctx.fillRect(x(lone.t) - 1.5, y(lone.v[i] as number) - 1.5, 3, 3);
          pen = false;
          run = 0;
          continue;
        }
        if (pen) ctx.lineTo(x(p.t), y(v));
        else ctx.moveTo(x(p.t), y(v));
        pen = true;
        run += 1;
        lone = p;
      }
      ctx.stroke();
      if (run === 1 && lone) ctx.fillRect(x(lone.t) - 1.5, y(lone.v[i] as number) - 1.5, 3, 3);
    });
    this.draws += 1;
    c.dataset.draws = String(this.draws);
  }
}
