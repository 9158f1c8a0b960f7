// The expert grid: one canvas, no per-cell DOM. Rows = EMAP rows (labelled with the layer index
// the server derived from engine data), columns = experts. Each frame the cells are painted
// into a cols x rows ImageData (one pixel per expert), which is scaled up with smoothing off:
// cost grows with the cell count only, so 78 x 256 stays a 20k-pixel loop per frame.
import { brightness, heatOf, hexBytes, hitCells, tierOf, TIER_RGB } from "./emap";

const LABEL_W = 46;
const FADE = 0.94; // per animation frame, as colibri's grid

export class GridView {
  rows = 0;
  cols = 0;
  layers: number[] = [];
  emap: Uint8Array = new Uint8Array(0);
  flash = new Float32Array(0);
  windows = new Uint32Array(0);   // HITS windows each expert fired in since the page opened
  highlight: Set<number> | null = null;
  // A chat message's routing (?message=<id>): cell -> selections by that message. While set,
  // its cells are painted with brightness by count and every other cell is dimmed.
  filter: Map<number, number> | null = null;
  private filterMax = 1;
  frames = 0;
  paintMs = 0;   // total time spent painting (the benchmark reports the mean)
  lastHitAt = 0;
  private cellW = 1;
  private cellH = 1;
  private img: ImageData | null = null;
  private off = document.createElement("canvas");
  private dirty = true;
  private labelsDirty = true;
  private running = false;

  constructor(private canvas: HTMLCanvasElement) {}

  setMap(rows: number, cols: number, hex: string): void {
    if (rows !== this.rows || cols !== this.cols) {
      this.rows = rows;
      this.cols = cols;
      this.flash = new Float32Array(rows * cols);
      this.windows = new Uint32Array(rows * cols);
      this.off.width = Math.max(cols, 1);
      this.off.height = Math.max(rows, 1);
      this.img = cols && rows ? new ImageData(cols, rows) : null;
      this.resize();
    }
    this.emap = hexBytes(hex, rows * cols);
    this.wake();
  }

  setLayers(layers: number[]): void { this.layers = layers; this.labelsDirty = true; this.wake(); }

  setHighlight(cells: Set<number> | null): void { this.highlight = cells; this.dirty = true; this.wake(); }

  setFilter(counts: Map<number, number> | null): void {
    this.filter = counts;
    this.filterMax = counts && counts.size ? Math.max(...counts.values()) : 1;
    this.dirty = true;
    this.wake();
  }

  hit(rows: number, cols: number, hex: string): number[] {
    if (rows !== this.rows || cols !== this.cols) return [];
    const cells = hitCells(hex, rows * cols);
    for (const i of cells) { this.flash[i] = 1; this.windows[i]++; }
    if (cells.length) this.lastHitAt = performance.now();
    this.wake();
    return cells;
  }

  layerOf(row: number): number { return this.layers.length === this.rows ? this.layers[row] : row; }

  // Fits the canvas to its panel. Setting a canvas's width or height clears its bitmap, so a
  // resize must schedule a repaint itself: the loop is idle once nothing flashes, and a window
  // resize (or a full-page screenshot, which resizes the viewport) used to leave the grid blank
  // until the next HITS (issue 23: a 48 x 128 map with no turn yet stayed blank).
  resize(): void {
    const parent = this.canvas.parentElement;
    const width = Math.max(200, parent ? parent.clientWidth : 800);
    this.cellW = this.cols ? Math.max(1, Math.min(48, Math.floor((width - LABEL_W) / this.cols))) : 1;
    this.cellH = this.rows ? Math.max(2, Math.min(32, Math.floor(640 / this.rows))) : 1;
    const dpr = window.devicePixelRatio || 1;
    const w = LABEL_W + this.cellW * this.cols, h = Math.max(this.cellH * this.rows, 20);
    const pw = Math.round(w * dpr), ph = Math.round(h * dpr);
    if (this.canvas.width !== pw || this.canvas.height !== ph) {
      this.canvas.width = pw;
      this.canvas.height = ph;
    }
    this.canvas.style.width = `${w}px`;
    this.canvas.style.height = `${h}px`;
    this.labelsDirty = true;
    this.wake();
  }

  // (row, col) under a point in CSS pixels of the canvas, or null.
  cellAt(x: number, y: number): { row: number; col: number } | null {
    const col = Math.floor((x - LABEL_W) / this.cellW), row = Math.floor(y / this.cellH);
    if (x < LABEL_W || col < 0 || row < 0 || col >= this.cols || row >= this.rows) return null;
    return { row, col };
  }

  // Centre of a cell in CSS pixels (tests and the card use it).
  cellCentre(row: number, col: number): { x: number; y: number } {
    return { x: LABEL_W + (col + 0.5) * this.cellW, y: (row + 0.5) * this.cellH };
  }

  private wake(): void {
    this.dirty = true;
    if (!this.running) { this.running = true; requestAnimationFrame(() => this.frame()); }
  }

  private frame(): void {
    const t0 = performance.now();
    const flashing = this.paint();
    this.paintMs += performance.now() - t0;
    this.frames++;
    if (flashing || this.dirty) requestAnimationFrame(() => this.frame());
    else this.running = false;
  }

  // Paints one frame; returns whether any cell is still fading.
  private paint(): boolean {
    const ctx = this.canvas.getContext("2d");
    if (!ctx || !this.img) { this.dirty = false; return false; }
    const px = this.img.data, n = this.rows * this.cols, hl = this.highlight, fl = this.filter;
    let flashing = false;
    for (let i = 0; i < n; i++) {
      const b = this.emap[i], rgb = TIER_RGB[tierOf(b)];
      let k = brightness(heatOf(b));
      if (fl) {
        const c = fl.get(i);
        k = c === undefined ? 0.12 : 0.45 + 0.55 * (c / this.filterMax);
      }
      if (hl && !hl.has(i)) k *= 0.35;
      const f = this.flash[i] > 0.01 ? this.flash[i] : 0;  // the last faded frame paints the plain cell
      const o = i * 4;
      px[o] = rgb[0] * k + (255 - rgb[0] * k) * f;
      px[o + 1] = rgb[1] * k + (255 - rgb[1] * k) * f;
      px[o + 2] = rgb[2] * k + (255 - rgb[2] * k) * f;
      px[o + 3] = 255;
      if (f) { this.flash[i] = f * FADE; flashing = true; } else this.flash[i] = 0;
    }
    this.off.getContext("2d")!.putImageData(this.img, 0, 0);
    const dpr = window.devicePixelRatio || 1;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.off, LABEL_W, 0, this.cellW * this.cols, this.cellH * this.rows);
    if (this.labelsDirty || !this.cache) this.labels();
    ctx.drawImage(this.cache!, 0, 0, LABEL_W, this.cellH * this.rows);
    this.dirty = false;
    return flashing;
  }

  private cache: HTMLCanvasElement | null = null;

  private labels(): void {
    const c = document.createElement("canvas");
    const dpr = window.devicePixelRatio || 1;
    c.width = LABEL_W * dpr;
    c.height = Math.max(1, this.cellH * this.rows * dpr);
    const lc = c.getContext("2d")!;
    lc.scale(dpr, dpr);
    lc.fillStyle = "#6b7078";
    lc.font = "10px ui-monospace, monospace";
    lc.textBaseline = "middle";
    const every = Math.max(1, Math.ceil(11 / this.cellH));
    for (let r = 0; r < this.rows; r += every) lc.fillText(`L${this.layerOf(r)}`, 2, (r + 0.5) * this.cellH);
    this.cache = c;
    this.labelsDirty = false;
  }
}
