// Generated from experts/server_frames.py by `python manage.py frames_ts`: do not edit by hand
// (tests/experts/test_atlas_frames.py fails while this file differs from what the server declares).
import type { BridgeEntry } from "../hosts";
import type { AtlasInfo, Build, Grid, Repin, TiersInfo } from "./types";

export type ServerFrame =
  | { type: "snapshot"; up: boolean; status: string; model: Record<string, unknown> | null; tiers: TiersInfo | null; emap: Grid | null; entropy: number[] | null; busy: number; queue: number; hits: Grid | null; seq: number; updated: number | null; layers?: number[]; layer_source?: string; bridge: string; bridges: BridgeEntry[] }
  | { type: "telemetry"; up?: boolean; status?: string; model?: Record<string, unknown> | null; tiers?: TiersInfo | null; emap?: Grid | null; entropy?: number[] | null; busy?: number; queue?: number; hits?: Grid; windows?: number; repin?: Repin[]; turns?: { hit_pct: number; tok_s: number; completion_tokens: number }[]; layers?: number[]; layer_source?: string }
  | { type: "build"; build: Build }
  | { type: "atlas"; atlas: AtlasInfo }
  | { type: "error"; field: string; detail: string };
