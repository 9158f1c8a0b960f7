// The card shown on hover or click of an expert: live state from EMAP/HITS and what the atlas
// (experts.json) measured about it. Text only (textContent), never HTML from data.
import { heatOf, heatText, tierOf, TIER_NAMES } from "./emap";
import type { AtlasEntry } from "./types";

export interface CardFacts {
  layer: number;
  expert: number;
  byte: number;
  windows: number;       // HITS windows it fired in since the page opened
  totalWindows: number;
  pinnedByRepin: boolean;
  entry: AtlasEntry | null;
  hasAtlas: boolean;
  message?: { id: number; count: number };  // the ?message= filter: this expert's selections by it
}

function row(dl: HTMLElement, name: string, value: string, key: string): void {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value;
  dd.dataset.field = key;
  dl.append(dt, dd);
}

export function fillCard(card: HTMLElement, f: CardFacts): void {
  const tier = tierOf(f.byte);
  const title = document.createElement("h3");
  title.textContent = `Layer ${f.layer} · expert ${f.expert}`;
  const dl = document.createElement("dl");
  row(dl, "tier", TIER_NAMES[tier], "tier");
  row(dl, "heat", heatText(heatOf(f.byte)), "heat");
  const pinned = tier === 2 ? "yes (VRAM copy)" : f.pinnedByRepin ? "yes (re-pinned this session)"
    : tier === 1 ? "resident (pinned or cached)" : "no";
  row(dl, "pinned", pinned, "pinned");
  if (f.message)
    row(dl, `message ${f.message.id}`, f.message.count ? `selected ${f.message.count} times` : "not routed by this message", "message");
  row(dl, "recent turns", f.totalWindows ? `fired in ${f.windows} of ${f.totalWindows} HITS windows seen` : "no HITS seen yet", "recent");
  if (f.entry) {
    const e = f.entry;
    row(dl, "atlas", e.label, "label");
    row(dl, "entropy", `${e.entropy.toFixed(2)} bits`, "entropy");
    const top = Object.entries(e.affinity).sort((a, b) => b[1] - a[1]).slice(0, 3);
    row(dl, "top affinities", top.map(([c, p]) => `${c} ${(p * 100).toFixed(1)} %`).join(", "), "affinity");
  } else {
    row(dl, "atlas", f.hasAtlas ? "not in the atlas (below the replication gate)" : "no atlas for this model", "label");
  }
  card.replaceChildren(title, dl);
  card.hidden = false;
}
