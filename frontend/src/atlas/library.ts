// The atlas library panel: the current atlas of the model, import (upload), export (download),
// history, and the builder (start, progress pushed over the socket, cancel).
import { AtlasHttp, URLS } from "./client";
import type { AtlasInfo, AtlasList, Build, Validation } from "./types";

const $ = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;

// How a built atlas was measured, in words: the method and the expert count the probes used.
export function methodText(v: Validation | null): string {
  if (!v || !v.method) return "";
  const how = v.method === "routes"
    ? "exact per-request selection counts (the engine's ROUTES), probes kept out of the usage heat"
    : "HITS windows (this engine reports no per-request routing)";
  const used = v.experts ?? v.top_k;
  if (!used) return `Measured with ${how}.`;
  const of = v.n_experts ? ` of ${v.n_experts}` : "";
  let text = `Probed at ${used}${of} experts per token`;
  if (v.experts && v.top_k && v.experts !== v.top_k)
    text += ` (the model serves ${v.top_k}): at more than a quarter of a layer's experts per token, every expert is ` +
      "selected for most tokens of every topic and none can stand out by its counts, so the builder asks for the " +
      "router's first choices";
  else text += " (the model's own count)";
  return `${text}. Measured with ${how}.`;
}

export class Library {
  list: AtlasList | null = null;
  build: Build | null = null;

  constructor(private http: AtlasHttp, private onCurrent: (a: AtlasInfo | null) => void) {
    $<HTMLInputElement>("atlas-file").addEventListener("change", (e) => this.upload(e.target as HTMLInputElement));
    $<HTMLButtonElement>("build-start").addEventListener("click", () => this.startBuild());
    $<HTMLButtonElement>("build-cancel").addEventListener("click", () => this.cancelBuild());
  }

  private notice(text: string, error = false): void {
    const el = $("library-notice");
    el.textContent = text;
    el.classList.toggle("error", error);
  }

  async refresh(): Promise<void> {
    this.list = await this.http.atlases();
    const cur = this.list.current;
    $("atlas-model").textContent = this.list.model;
    const info = $("atlas-current");
    if (cur) {
      const v = cur.validation ? ` · leave-one-prompt-out ${cur.validation.correct}/${cur.validation.total} = ${(cur.validation.accuracy * 100).toFixed(1)} %` : "";
      info.textContent = `#${cur.id} (${cur.source}${cur.filename ? `, ${cur.filename}` : ""}) · ${cur.entries} experts, ${cur.specialists} specialists · ${cur.categories.length} categories${v}`;
      $("atlas-method").textContent = methodText(cur.validation);
      const a = $<HTMLAnchorElement>("atlas-download");
      a.href = URLS.download(cur.id);
      a.hidden = false;
    } else {
      info.textContent = "No atlas for this model yet: import colibri's experts.json or build one.";
      $("atlas-method").textContent = "";
      $<HTMLAnchorElement>("atlas-download").hidden = true;
    }
    const body = $("atlas-history");
    body.replaceChildren(...this.list.history.map((a) => {
      const tr = document.createElement("tr");
      const cells = [`#${a.id}`, a.model, a.source, String(a.entries), String(a.specialists),
        a.validation ? `${(a.validation.accuracy * 100).toFixed(1)} %` : "–", new Date(a.created).toLocaleString()];
      for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.append(td); }
      const td = document.createElement("td");
      const link = document.createElement("a");
      link.href = URLS.download(a.id);
      link.textContent = "download";
      td.append(link);
      tr.append(td);
      return tr;
    }));
    this.onCurrent(cur);
  }

  private async upload(input: HTMLInputElement): Promise<void> {
    const file = input.files?.[0];
    if (!file) return;
    try {
      const atlas = await this.http.upload(file);
      await this.refresh();  // first, so the notice appears once the page shows the new atlas
      this.notice(`Imported ${file.name}: ${atlas.entries} experts.`);
    } catch (e) {
      this.notice(`Import failed: ${(e as Error).message}`, true);
    } finally {
      input.value = "";
    }
  }

  private async startBuild(): Promise<void> {
    try {
      this.showBuild(await this.http.startBuild());
    } catch (e) {
      this.notice(`Build not started: ${(e as Error).message}`, true);
    }
  }

  private async cancelBuild(): Promise<void> {
    if (!this.build) return;
    try { this.showBuild(await this.http.cancelBuild(this.build.id)); } catch (e) { this.notice((e as Error).message, true); }
  }

  async loadBuilds(): Promise<void> {
    try {
      const { builds } = await this.http.builds();
      if (builds.length) this.showBuild(builds[0]);
    } catch { /* the builder may be absent */ }
  }

  showBuild(b: Build): void {
    if (this.build && b.id < this.build.id) return;
    if (this.list && b.model !== this.list.model) return; // another host's model (every page hears every build)
    this.build = b;
    const bar = $<HTMLProgressElement>("build-progress");
    bar.max = Math.max(b.total, 1);
    bar.value = b.done;
    const pct = b.total ? Math.floor((100 * b.done) / b.total) : 0;
    const running = b.status === "queued" || b.status === "running";
    const wall = b.wall_s !== null ? ` in ${b.wall_s.toFixed(1)} s` : "";
    $("build-status").textContent = `build #${b.id}: ${b.status} · ${pct} % (${b.done}/${b.total} probes)${wall}${b.error ? ` · ${b.error}` : ""}`;
    $("build-status").dataset.status = b.status;
    $("build-status").dataset.percent = String(pct);
    $<HTMLButtonElement>("build-cancel").hidden = !running;
    $<HTMLButtonElement>("build-start").disabled = running;
    if (b.status === "done") void this.refresh();
  }
}
