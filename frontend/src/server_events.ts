// Generated from chat/server_frames.py by `python manage.py frames_ts`: do not edit by hand
// (tests/web/test_chat_frames.py fails while this file differs from what the server declares).
import type { Conversation, Message } from "./api";

export type ServerEvent =
  | { type: "conversation"; conversation: Conversation }
  | { type: "snapshot"; conversation: number; messages: Message[] }
  | { type: "message"; message: Message }
  | { type: "queued"; message: number; position: number }
  | { type: "started"; message: number; prompt_tokens: number }
  | { type: "delta"; message: number; offset: number; text: string }
  | { type: "thinking"; message: number; offset: number; text: string }
  | { type: "done"; message: Message }
  | { type: "error"; message: number | null; code: string; detail: string; field?: string; ref?: string }
  | { type: "title"; conversation: number; title: string };
