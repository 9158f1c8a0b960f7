// The engine host picker of the atlas and ops pages (issue 26 item 3): a select of the live
// bridges (what /ws/atlas/'s snapshot and /ops/stats.json list, engine_bridge/fleet.py), the one
// shown selected. A choice reloads the page with ?bridge=<id>, so the page starts clean from that
// host's snapshot and the address names the host it shows (a link or a reload keeps it).

// One live bridge (engine_bridge.fleet.bridge_entry); must declare every key of
// experts/server_frames.py's BridgeEntryData (tests/experts/test_atlas_frames.py checks).
export interface BridgeEntry {
  id: string;
  host: string;
  model: string;
  status: string;
  slots: number;
  busy: number;
  queued: number;
  queue_limit: number; // its queue's bound (0: unknown)
  context: number;     // context length
  beat_age_s: number;  // seconds since its last heartbeat
}

// The bridge the address asks for (?bridge=<id>), or null for the default one.
export function askedBridge(): string | null {
  return new URLSearchParams(location.search).get("bridge");
}

export function withBridge(url: string, bridge: string | null): string {
  return bridge ? `${url}${url.includes("?") ? "&" : "?"}bridge=${encodeURIComponent(bridge)}` : url;
}

function label(b: BridgeEntry): string {
  return `${b.host} · ${b.model} (${b.id}${b.status === "up" ? "" : `, ${b.status}`})`;
}

export class HostPicker {
  private select: HTMLSelectElement;
  private shown = "";

  constructor(private slot: HTMLElement) {
    slot.hidden = true; // until the server names the bridges
    this.select = document.createElement("select");
    this.select.name = "bridge";
    this.select.className = "host-picker";
    this.select.setAttribute("aria-label", "Engine host");
    this.select.addEventListener("change", () => this.choose(this.select.value));
    slot.append(this.select);
  }

  // The live bridges and the one this page shows; the list is redrawn only when it changed.
  set(bridges: BridgeEntry[], current: string): void {
    const key = JSON.stringify([bridges.map((b) => [b.id, b.host, b.model, b.status]), current]);
    if (key === this.shown) return;
    this.shown = key;
    this.slot.hidden = false;
    const options = bridges.map((b) => {
      const o = document.createElement("option");
      o.value = b.id;
      o.textContent = label(b);
      return o;
    });
    if (!bridges.some((b) => b.id === current)) {
      const o = document.createElement("option");
      o.value = current;
      o.textContent = `${current} (not live)`;
      options.push(o);
    }
    this.select.replaceChildren(...options);
    this.select.value = current;
  }

  private choose(bridge: string): void {
    const url = new URL(location.href);
    url.searchParams.set("bridge", bridge);
    location.assign(url.pathname + url.search);
  }
}
