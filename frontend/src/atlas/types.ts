// Shapes of what the atlas page receives (experts/views.py, experts/consumers.py) and of
// colibri's experts.json (peers.md §4). The socket's frames (ServerFrame) are generated from
// experts/server_frames.py into server_frames.ts; Grid, TiersInfo, Repin, Build and AtlasInfo below
// must declare every key the server's GridData, TiersData, RepinData, BuildData and AtlasInfoData
// have (tests/experts/test_atlas_frames.py checks).
import type { TurnIo } from "../ops/io";
import type { ServerFrame } from "./server_frames";

export type { ServerFrame };

// What the page applies from a frame: a telemetry frame's keys, each optional (the snapshot
// carries the same state fields, and the page applies it as one).
export type TelemetryFields = Omit<Extract<ServerFrame, { type: "telemetry" }>, "type">;

export interface Grid { rows: number; cols: number; hex: string }

export interface TiersInfo { vram_experts: number; ram_experts: number; disk_experts: number; vram_gb: number; ram_gb: number }

export interface Repin { layer: number; expert: number; old_tier: number; gpu: number }

export interface AtlasEntry { affinity: Record<string, number>; entropy: number; top: string; label: string }
export interface AtlasDoc { categories: string[]; experts: Record<string, AtlasEntry> }

export interface AtlasInfo {
  id: number; model: string; source: string; sha256: string; filename: string; entries: number;
  specialists: number; categories: string[]; validation: Validation | null; bytes: number; created: string;
}

// The builder's leave-one-prompt-out figure and how it measured (experts/services.py _measure):
// method "routes" (exact per-request counts) or "hits"; experts = the experts=N the probes sent
// (null: the model's own top_k).
export interface Validation {
  correct: number; total: number; accuracy: number;
  method?: string; experts?: number | null; top_k?: number | null; n_experts?: number;
}

export interface AtlasList { model: string; model_id: string; current: AtlasInfo | null; history: AtlasInfo[] }

export interface MapData { categories: string[]; points: [string, number, number, string][] }

export interface Build {
  id: number; model: string; served_model: string; status: string; done: number; total: number; atlas: number | null;
  error: string; wall_s: number | null; created: string;
}

// One phase of a message's turn (chat.services.routing_phases_unpack): the positions it
// forwarded and their selections.
export interface PhaseRouting {
  counts: [number, number, number][]; experts: number; selections: number; positions: number;
}

// One chat message's routing (chat/views.py message_routing): rows in EMAP order.
export interface MessageRouting {
  message: number; conversation: number; rows: number; cols: number;
  counts: [number, number, number][];   // [row, expert, selections], nonzero only
  experts: number; selections: number;
  io?: TurnIo | null;   // that turn's expert I/O (the engine's IOSTAT), when it sent one
  // The same counts split by phase, in turn order ("prompt", "thinking" for a reasoning model,
  // "answer"); null when the engine reported no per-token routing.
  phases?: Record<string, PhaseRouting> | null;
}
