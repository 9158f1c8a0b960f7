// The atlas page's one client: JSON endpoints under /atlas/api and the /ws/atlas/ socket.
import { askedBridge, withBridge } from "../hosts";
import type { AtlasDoc, AtlasInfo, AtlasList, Build, MapData, MessageRouting, ServerFrame } from "./types";

export class AtlasError extends Error {
  constructor(public status: number, message: string) { super(message); }
}

export const URLS = {
  atlases: "/atlas/api/atlases",
  download: (id: number) => `/atlas/api/atlases/${id}/experts.json`,
  map: (id: number) => `/atlas/api/atlases/${id}/map`,
  builds: "/atlas/api/builds",
  cancel: (id: number) => `/atlas/api/builds/${id}/cancel`,
  routing: (id: number) => `/atlas/api/messages/${id}/routing`,
  socket: "/ws/atlas/",
};

// The library's calls name the page's engine host (?bridge=), so the server answers for the
// model that host serves; calls by atlas or build id need none.
export class AtlasHttp {
  constructor(private csrfToken: string, private bridge: string | null = askedBridge()) {}

  private forBridge(url: string): string { return withBridge(url, this.bridge); }

  private async request<T>(method: string, url: string, body?: BodyInit): Promise<T> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (method !== "GET") headers["X-CSRFToken"] = this.csrfToken;
    const res = await fetch(url, { method, headers, body, credentials: "same-origin" });
    const text = await res.text();
    let parsed: unknown = null;
    try { parsed = text ? JSON.parse(text) : null; } catch { parsed = null; }
    if (!res.ok) {
      const error = parsed && typeof parsed === "object" ? (parsed as Record<string, unknown>).error : null;
      throw new AtlasError(res.status, typeof error === "string" ? error : `${res.status} ${res.statusText}`);
    }
    return parsed as T;
  }

  atlases(): Promise<AtlasList> { return this.request("GET", this.forBridge(URLS.atlases)); }
  doc(id: number): Promise<AtlasDoc> { return this.request("GET", URLS.download(id)); }
  map(id: number): Promise<MapData> { return this.request("GET", URLS.map(id)); }
  routing(message: number): Promise<MessageRouting> { return this.request("GET", URLS.routing(message)); }

  async upload(file: File): Promise<AtlasInfo> {
    const form = new FormData();
    form.append("file", file);
    return (await this.request<{ atlas: AtlasInfo }>("POST", this.forBridge(URLS.atlases), form)).atlas;
  }

  builds(): Promise<{ builds: Build[] }> { return this.request("GET", this.forBridge(URLS.builds)); }
  async startBuild(): Promise<Build> {
    return (await this.request<{ build: Build }>("POST", this.forBridge(URLS.builds))).build;
  }
  async cancelBuild(id: number): Promise<Build> { return (await this.request<{ build: Build }>("POST", URLS.cancel(id))).build; }
}

// Reconnects with backoff; every (re)connect starts with a snapshot from the server, so a drop
// loses nothing the page needs (the grid is state, not a log).
export class AtlasSocket {
  private delay = 500;
  constructor(private onFrame: (f: ServerFrame) => void, private onState: (s: string) => void) {}

  connect(): void {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${withBridge(URLS.socket, askedBridge())}`);
    this.onState("connecting");
    ws.onopen = () => { this.delay = 500; this.onState("live"); };
    ws.onmessage = (e) => { try { this.onFrame(JSON.parse(String(e.data)) as ServerFrame); } catch { /* ignore */ } };
    ws.onclose = (e) => {
      if (e.code === 4401 || e.code === 4403) { this.onState(e.code === 4401 ? "signed out" : "staff only"); return; }
      if (e.code === 4404) { this.onState("no such engine host"); return; }
      this.onState("reconnecting");
      setTimeout(() => this.connect(), this.delay);
      this.delay = Math.min(this.delay * 2, 10000);
    };
  }
}
