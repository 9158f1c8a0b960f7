// A turn's expert I/O as the engine reports it (IOSTAT, once per turn; shaped by
// engine_bridge.protocol.IoStat.figures): its type and its wording, shared by /ops (the last turn,
// engine-wide) and the atlas (one chat message's turn, beside its routing). No side effects.

export interface TurnIo {
  id: number; tokens: number; disk_bytes: number; ideal_bytes: number; hits: number; acquisitions: number;
  stall_s: number; prefetch_issued: number; prefetch_used: number;
  disk_bytes_per_token: number | null; ideal_bytes_per_token: number | null; hit_pct: number | null;
  stall_ms_per_token: number | null; prefetch_accuracy_pct: number | null;
}

export function formatBytes(v: number | null | undefined): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return "–";
  if (v >= 1e9) return `${(v / 1e9).toFixed(2)} GB`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)} MB`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)} kB`;
  return `${v.toFixed(0)} B`;
}

const pct = (v: number | null) => (v === null ? "–" : `${v.toFixed(1)} %`);

// The five figures, worded: disk and ideal bytes per token, hit %, stall per token, prefetch.
export function ioFigures(io: TurnIo): { disk: string; ideal: string; hit: string; stall: string; prefetch: string } {
  return {
    disk: formatBytes(io.disk_bytes_per_token),
    ideal: formatBytes(io.ideal_bytes_per_token),
    hit: pct(io.hit_pct),
    stall: io.stall_ms_per_token === null ? "–" : `${io.stall_ms_per_token.toFixed(1)} ms`,
    prefetch: io.prefetch_issued ? `${pct(io.prefetch_accuracy_pct)} of ${io.prefetch_issued}` : "none issued",
  };
}
