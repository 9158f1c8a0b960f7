// Human wording for stats and error codes, kept apart from the DOM code so it reads as a table.
import type { Stats as ApiStats } from "../api";

// experts_routed: how many distinct experts answered (the engine's ROUTES), when it reported them.
type Stats = ApiStats & { experts_routed?: number | null };

function num(v: number | null | undefined): v is number {
  return typeof v === "number" && Number.isFinite(v);
}

// "37 prompt · 128 tokens · TTFT 0.21 s · 24.5 tok/s · 93% expert hits · stop"
// `href` (staff, when the engine said which experts answered): the stat links to the atlas.
export function statsParts(s: Stats | null, atlasHref?: string): { label: string; value: string; warn?: boolean; href?: string }[] {
  if (!s) return [];
  const parts: { label: string; value: string; warn?: boolean; href?: string }[] = [];
  if (num(s.prompt_tokens)) parts.push({ label: "prompt", value: `${s.prompt_tokens} tok` });
  if (num(s.completion_tokens)) parts.push({ label: "reply", value: `${s.completion_tokens} tok` });
  if (num(s.reasoning_tokens)) parts.push({ label: "thinking", value: `${s.reasoning_tokens} tok` }); // of the reply's
  if (num(s.ttft_s)) parts.push({ label: "first token", value: `${s.ttft_s < 10 ? s.ttft_s.toFixed(2) : s.ttft_s.toFixed(1)} s` });
  if (num(s.tok_s)) parts.push({ label: "speed", value: `${s.tok_s.toFixed(1)} tok/s` });
  if (num(s.hit_pct))
    parts.push({ label: "expert hits", value: `${s.hit_pct.toFixed(0)}%`, href: num(s.experts_routed) ? atlasHref : undefined });
  if (s.finish_reason) {
    const cut = s.finish_reason === "length";
    parts.push({ label: "finish", value: cut ? "length (max tokens reached)" : s.finish_reason, warn: cut });
  }
  return parts;
}

export const ERROR_TEXT: Record<string, string> = {
  ENGINE_DIED: "The engine stopped during this reply and is restarting. The partial reply was kept.",
  ENGINE_UNAVAILABLE: "The engine is not available right now (starting or restarting). Try again in a moment.",
  CONTEXT_EXCEEDED:
    "This conversation no longer fits the model's context window. Start a new chat, or edit an earlier message to shorten it.",
  QUEUE_FULL: "The server is busy: the queue is full. Try again shortly.",
  CANCELLED: "Stopped.",
  BAD_REQUEST: "The request was rejected.",
  ENGINE_ERROR: "The engine reported an error.",
};

export function errorMessage(code: string, detail: string): string {
  const base = ERROR_TEXT[code];
  if (!base) return detail || `Something went wrong (${code}).`;
  if (!detail || detail === base) return base;
  return `${base} (${detail})`;
}

export function relativeDay(iso: string): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return "";
  const days = Math.floor((Date.now() - d.getTime()) / 86400000);
  if (days <= 0) return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  if (days === 1) return "yesterday";
  if (days < 7) return `${days} days ago`;
  return d.toLocaleDateString();
}
