// The one client for the server: typed websocket events (docs/contracts.md, "Chat websocket") and
// the JSON HTTP endpoints (conversations, API keys, /health). Nothing else in the front end builds
// URLs or touches fetch/WebSocket directly. The server's frames (ServerEvent) are generated from
// chat/server_frames.py into server_events.ts; Message and Conversation below must declare every
// key the server's MessageData / ConversationData have (tests/web/test_chat_frames.py checks).
import type { ServerEvent } from "./server_events";

export type { ServerEvent };

export type MessageRole = "user" | "assistant" | "system" | "tool";
export type MessageStatus = "streaming" | "complete" | "interrupted" | "error";

export interface Stats {
  prompt_tokens?: number | null;
  completion_tokens?: number | null;
  ttft_s?: number | null;
  bridge?: string | null; // the engine host (bridge id) that answered
  tok_s?: number | null;
  hit_pct?: number | null;
  finish_reason?: string | null;
  reasoning_tokens?: number | null; // of completion_tokens, spent thinking
  thinking_s?: number | null; // from the first thinking text to the first answer text
}

// One call an assistant turn made (chat/models.py Message.tool_calls): arguments is the JSON text
// the model wrote, possibly not valid JSON.
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

export interface Message {
  id: number;
  conversation: number;
  role: MessageRole;
  text: string; // the answer only
  thinking?: string; // a reasoning model's thinking before the answer ("" or absent: none)
  status: MessageStatus;
  stats: Stats | null;
  tool_calls?: ToolCall[]; // assistant turns of an imported API conversation
  tool_call_id?: string; // role "tool": the call this is the result of
  created: string;
}

export interface Conversation {
  id: number;
  title: string;
  model?: string; // the served model's id its turns go to; "" = the default model
  system_prompt?: string; // the first (system) message of every turn's prompt; "" = none
  created: string;
  updated: string;
}

// What a conversation's settings can change (PATCH /api/conversations/<id>).
export interface ConversationPatch {
  title?: string;
  model?: string;
  system_prompt?: string;
}

// One model the live bridges serve (GET /api/models), for the model picker.
export interface ModelInfo {
  id: string;
  display_name: string;
  context_length: number;
  status: string;
  bridges: string[];
}

export interface ModelList {
  default: string | null; // the id a conversation without a model of its own uses
  models: ModelInfo[];
}

export interface GenParams {
  temperature?: number; // absent = the served model's default (Health.sampling)
  top_p?: number;
  max_tokens: number;
  experts?: number; // routed experts per token; absent = the model's own default
}

// The per-request expert count the served model takes (our engine's MODEL line), from /health.
export interface ExpertRange {
  default: number;
  min: number;
  max: number;
}

export type ClientEvent =
  | { type: "send"; conversation: number | null; text: string; params: GenParams; model?: string; system_prompt?: string }
  | { type: "stop"; conversation: number }
  | { type: "regenerate"; conversation: number; params: GenParams }
  | { type: "edit"; conversation: number; message: number; text: string; params: GenParams }
  | { type: "open"; conversation: number };

export type ConnectionState = "connecting" | "open" | "closed";

export interface ApiKey {
  id: number | string;
  name: string;
  prefix?: string;
  created?: string;
  last_used?: string | null;
  key?: string; // only in the answer to the create call
}

// What a request that names no temperature / top_p gets: the served model's recommendation, or the server's.
export interface SamplingDefaults {
  temperature: number;
  top_p: number;
}

export interface Health {
  ok: boolean;
  state: string; // "ok", "starting", "restarting", "down", "unreachable", ...
  reason: string;
  experts: ExpertRange | null;
  sampling?: SamplingDefaults | null;
}

export class ApiError extends Error {
  constructor(
    public status: number,
    message: string,
  ) {
    super(message);
  }
}

const URLS = {
  conversations: "/api/conversations",
  conversation: (id: number) => `/api/conversations/${id}`,
  importConversation: "/api/conversations/import",
  models: "/api/models",
  keys: "/api/keys",
  key: (id: number | string) => `/api/keys/${encodeURIComponent(String(id))}`,
  health: "/health",
  ws: "/ws/chat/",
};

// Lists may come bare or wrapped ({"conversations": [...]}, {"keys": [...]}, DRF's {"results": [...]}).
function unwrapList<T>(body: unknown, key: string): T[] {
  if (Array.isArray(body)) return body as T[];
  if (body && typeof body === "object") {
    const o = body as Record<string, unknown>;
    for (const k of [key, "results", "data", "items"]) if (Array.isArray(o[k])) return o[k] as T[];
  }
  return [];
}

function unwrapOne<T>(body: unknown, key: string): T {
  if (body && typeof body === "object" && key in (body as object)) {
    const inner = (body as Record<string, unknown>)[key];
    if (inner && typeof inner === "object" && !Array.isArray(inner)) return inner as T;
  }
  return body as T;
}

function errorText(body: unknown, fallback: string): string {
  if (body && typeof body === "object") {
    const o = body as Record<string, unknown>;
    const e = o.error;
    if (typeof e === "string") return e;
    if (e && typeof e === "object" && typeof (e as Record<string, unknown>).message === "string")
      return (e as Record<string, string>).message;
    for (const k of ["detail", "message", "reason"]) if (typeof o[k] === "string") return o[k] as string;
    // DRF's field errors: {"model": ["the model 'x' is not served here ..."]}
    for (const [k, v] of Object.entries(o)) if (Array.isArray(v) && typeof v[0] === "string") return `${k}: ${v[0]}`;
  }
  return fallback;
}

export class Http {
  constructor(private csrfToken: string) {}

  private async request(method: string, url: string, body?: unknown): Promise<unknown> {
    const headers: Record<string, string> = { Accept: "application/json" };
    if (method !== "GET") headers["X-CSRFToken"] = this.csrfToken;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(url, {
      method,
      headers,
      credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    if (!res.ok) throw new ApiError(res.status, errorText(parsed, `${res.status} ${res.statusText}`));
    return parsed;
  }

  async listConversations(query = ""): Promise<Conversation[]> {
    const url = query ? `${URLS.conversations}?q=${encodeURIComponent(query)}` : URLS.conversations;
    return unwrapList<Conversation>(await this.request("GET", url), "conversations");
  }

  async renameConversation(id: number, title: string): Promise<Conversation> {
    return this.updateConversation(id, { title });
  }

  async getConversation(id: number): Promise<Conversation> {
    return unwrapOne<Conversation>(await this.request("GET", URLS.conversation(id)), "conversation");
  }

  // The server checks every field: an unknown model or an over-long system prompt is a 400 naming it.
  async updateConversation(id: number, patch: ConversationPatch): Promise<Conversation> {
    return unwrapOne<Conversation>(await this.request("PATCH", URLS.conversation(id), patch), "conversation");
  }

  async listModels(): Promise<ModelList> {
    const body = (await this.request("GET", URLS.models)) as Partial<ModelList> | null;
    return { default: body?.default ?? null, models: Array.isArray(body?.models) ? body.models : [] };
  }

  // An API conversation ({"messages": [OpenAI Chat messages]}): the server checks every field.
  async importConversation(body: unknown): Promise<Conversation> {
    return unwrapOne<Conversation>(await this.request("POST", URLS.importConversation, body), "conversation");
  }

  async deleteConversation(id: number): Promise<void> {
    await this.request("DELETE", URLS.conversation(id));
  }

  async listKeys(): Promise<ApiKey[]> {
    return unwrapList<ApiKey>(await this.request("GET", URLS.keys), "keys");
  }

  async createKey(name: string): Promise<ApiKey> {
    return unwrapOne<ApiKey>(await this.request("POST", URLS.keys, { name }), "key_info");
  }

  async revokeKey(id: number | string): Promise<void> {
    await this.request("DELETE", URLS.key(id));
  }

  // /health answers 200 when the engine is up and 503 with a reason otherwise; both carry JSON.
  async health(): Promise<Health> {
    let res: Response;
    try {
      res = await fetch(URLS.health, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    } catch {
      return { ok: false, state: "unreachable", reason: "The server cannot be reached.", experts: null };
    }
    let body: Record<string, unknown> = {};
    try {
      body = (await res.json()) as Record<string, unknown>;
    } catch {
      /* a non-JSON answer still has a status code */
    }
    // engine_bridge/views.py: {"engine": "up" | "starting" | "down" | "refused", "restarts": n,
    // "refusal": the engine's reason for refusing its model file, ...}
    const engineState = typeof body.engine === "string" ? body.engine : undefined;
    let state = String(engineState ?? body.state ?? body.status ?? (res.ok ? "up" : "down"));
    if (state === "starting" && Number(body.restarts) > 0) state = "restarting";
    const ok = res.ok && body.up !== false && (state === "up" || state === "ok");
    const reason = String(body.refusal ?? body.reason ?? body.detail ?? "");
    const e = body.experts as Partial<ExpertRange> | null | undefined;
    const experts =
      e && Number.isInteger(e.min) && Number.isInteger(e.max) && Number.isInteger(e.default)
        ? { default: e.default as number, min: e.min as number, max: e.max as number }
        : null;
    const d = body.sampling as Partial<SamplingDefaults> | null | undefined;
    const sampling =
      d && Number.isFinite(d.temperature) && Number.isFinite(d.top_p)
        ? { temperature: d.temperature as number, top_p: d.top_p as number }
        : null;
    return { ok, state: ok ? "ok" : state, reason, experts, sampling };
  }
}

type Listener<T> = (value: T) => void;

// A websocket that reconnects with backoff and, once reconnected, re-opens the conversations it
// was subscribed to; the server answers each "open" with a snapshot, so nothing is lost across a drop.
export class ChatSocket {
  private ws: WebSocket | null = null;
  private retries = 0;
  private timer: number | undefined;
  private subscribed = new Set<number>();
  private outbox: ClientEvent[] = [];
  private eventListeners: Listener<ServerEvent>[] = [];
  private stateListeners: Listener<ConnectionState>[] = [];
  state: ConnectionState = "connecting";

  constructor(private path: string = URLS.ws) {}

  onEvent(fn: Listener<ServerEvent>): void {
    this.eventListeners.push(fn);
  }

  onState(fn: Listener<ConnectionState>): void {
    this.stateListeners.push(fn);
  }

  connect(): void {
    window.clearTimeout(this.timer);
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    this.setState("connecting");
    const ws = new WebSocket(`${scheme}//${location.host}${this.path}`);
    this.ws = ws;
    ws.onopen = () => {
      this.retries = 0;
      this.setState("open");
      for (const id of this.subscribed) this.raw({ type: "open", conversation: id });
      const pending = this.outbox;
      this.outbox = [];
      for (const ev of pending) this.raw(ev);
    };
    ws.onmessage = (e: MessageEvent) => {
      let ev: ServerEvent;
      try {
        ev = JSON.parse(String(e.data)) as ServerEvent;
      } catch {
        return;
      }
      if (ev.type === "conversation") this.subscribed.add(ev.conversation.id);
      for (const fn of this.eventListeners) fn(ev);
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.setState("closed");
      // 0.5 s, 1 s, 2 s ... capped at 10 s, with jitter so many tabs do not reconnect in step.
      const delay = Math.min(10000, 500 * 2 ** this.retries++) * (0.75 + Math.random() * 0.5);
      this.timer = window.setTimeout(() => this.connect(), delay);
    };
  }

  // Subscribe to one conversation (the one on screen); the server answers with a snapshot.
  open(id: number): void {
    this.subscribed.clear();
    this.subscribed.add(id);
    this.send({ type: "open", conversation: id });
  }

  unsubscribeAll(): void {
    this.subscribed.clear();
  }

  send(ev: ClientEvent): void {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.raw(ev);
    else if (ev.type !== "open") this.outbox.push(ev); // "open" is replayed from `subscribed`
  }

  private raw(ev: ClientEvent): void {
    this.ws?.send(JSON.stringify(ev));
  }

  private setState(s: ConnectionState): void {
    this.state = s;
    for (const fn of this.stateListeners) fn(s);
  }
}
