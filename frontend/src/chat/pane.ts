// The message column: user turns as plain text, assistant turns as sanitised markdown that is
// re-rendered at most once per animation frame while deltas stream in, and a stats row per turn.
// Tool calls (imported API conversations): a block per call under its assistant turn (name, id,
// arguments pretty-printed) and each result as its own turn; all of it text, never HTML.
// A reasoning model's thinking is a "Thinking" section above its answer: open while it streams,
// folded once the answer starts (unless the reader opened or closed it: then it stays so), kept
// with the message; rendered as the reply is (sanitised markdown), so nothing in it can run.
import type { Message, ToolCall } from "../api";
import { h } from "./dom";
import { errorMessage, statsParts } from "./format";
import { renderMarkdown } from "./markdown";

// What we know about a reply before its final stats arrive.
export interface LiveInfo {
  queued?: number;
  promptTokens?: number;
  startedAt?: number; // performance.now() when "started" arrived
  firstTextAt?: number;
  firstThinkingAt?: number;
  error?: { code: string; detail: string };
}

export interface PaneHandlers {
  regenerate(): void;
  edit(message: Message, text: string): void;
  canAct(): boolean;
  staff?: boolean; // staff see "expert hits" as a link to the atlas (a staff-only page)
}

interface View {
  root: HTMLElement;
  thinking: HTMLDetailsElement;
  thinkingLabel: HTMLElement;
  thinkingBody: HTMLElement;
  body: HTMLElement;
  meta: HTMLElement;
  actions: HTMLElement;
}

export class MessagePane {
  messages: Message[] = [];
  live = new Map<number, LiveInfo>();
  private views = new Map<number, View>();
  private dirty = new Set<number>();
  private frame = 0;
  private editing: number | null = null;
  private thinkingChoice = new Map<number, boolean>(); // message id -> open, as the reader left it
  private stickToBottom = true;

  constructor(
    private scroller: HTMLElement,
    private column: HTMLElement,
    private handlers: PaneHandlers,
  ) {
    scroller.addEventListener("scroll", () => {
      const gap = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;
      this.stickToBottom = gap < 80;
    });
    // The live stats line ticks while a reply streams.
    window.setInterval(() => {
      for (const m of this.messages) if (m.status === "streaming") this.markDirty(m.id);
    }, 500);
  }

  get streaming(): Message | undefined {
    return this.messages.find((m) => m.status === "streaming");
  }

  setMessages(messages: Message[]): void {
    this.messages = messages.slice().sort((a, b) => a.id - b.id);
    this.views.clear();
    this.editing = null;
    this.column.replaceChildren();
    this.stickToBottom = true;
    for (const m of this.messages) this.column.append(this.view(m).root);
    this.refreshAll();
    this.flush();
  }

  clear(): void {
    this.live.clear();
    this.thinkingChoice.clear();
    this.setMessages([]);
  }

  upsert(m: Message): void {
    const i = this.messages.findIndex((x) => x.id === m.id);
    if (i >= 0) this.messages[i] = m;
    else {
      this.messages.push(m);
      this.messages.sort((a, b) => a.id - b.id);
      const v = this.view(m);
      const next = this.messages[this.messages.indexOf(m) + 1];
      const nextView = next && this.views.get(next.id);
      if (nextView) this.column.insertBefore(v.root, nextView.root);
      else this.column.append(v.root);
      this.stickToBottom = true;
    }
    this.refreshAll(); // the "last reply" actions move
  }

  // Removes the given message and everything after it (edit / regenerate replace the tail).
  truncateFrom(id: number): void {
    for (const m of this.messages.filter((x) => x.id >= id)) {
      this.views.get(m.id)?.root.remove();
      this.views.delete(m.id);
      this.live.delete(m.id);
      this.thinkingChoice.delete(m.id);
    }
    this.messages = this.messages.filter((x) => x.id < id);
    this.refreshAll();
  }

  // Returns false when the delta leaves a gap (deltas were missed): the caller re-syncs.
  // A delta for a message not on screen belongs to another conversation this socket still
  // watches on the server (it never leaves a group before disconnecting): ignored.
  applyDelta(id: number, offset: number, text: string): boolean {
    const m = this.messages.find((x) => x.id === id);
    if (!m) return true;
    const have = m.text.length;
    if (offset > have) return false;
    if (offset + text.length <= have) return true; // already have it (replayed after a reconnect)
    m.text += text.slice(have - offset);
    const info = this.live.get(id) ?? {};
    const first = info.firstTextAt === undefined;
    if (first) info.firstTextAt = performance.now();
    this.live.set(id, info);
    this.dirty.add(id);
    // The reply's first text is painted now (the wait for an animation frame cost up to 16 ms of
    // the first token's latency); later deltas are coalesced into one paint per frame.
    if (first) this.flush();
    else this.schedule();
    return true;
  }

  // As applyDelta, for the message's thinking (its own offsets).
  applyThinking(id: number, offset: number, text: string): boolean {
    const m = this.messages.find((x) => x.id === id);
    if (!m) return true;
    const thinking = m.thinking ?? "";
    const have = thinking.length;
    if (offset > have) return false;
    if (offset + text.length <= have) return true;
    m.thinking = thinking + text.slice(have - offset);
    const info = this.live.get(id) ?? {};
    const first = info.firstThinkingAt === undefined;
    if (first) info.firstThinkingAt = performance.now();
    this.live.set(id, info);
    this.dirty.add(id);
    if (first) this.flush();
    else this.schedule();
    return true;
  }

  setLive(id: number, patch: Partial<LiveInfo>): void {
    this.live.set(id, { ...(this.live.get(id) ?? {}), ...patch });
    this.markDirty(id);
  }

  refreshAll(): void {
    for (const m of this.messages) this.dirty.add(m.id);
    this.schedule();
  }

  private markDirty(id: number): void {
    this.dirty.add(id);
    this.schedule();
  }

  private schedule(): void {
    if (!this.frame) this.frame = requestAnimationFrame(() => this.flush());
  }

  private flush(): void {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
    const lastAssistant = [...this.messages].reverse().find((m) => m.role === "assistant");
    const last = this.messages[this.messages.length - 1];
    for (const id of this.dirty) {
      const m = this.messages.find((x) => x.id === id);
      // After a tool result the next step is a new reply ("Continue"), not redoing the call turn.
      if (m) this.paint(m, m === last || (m === lastAssistant && last?.role !== "tool"));
    }
    this.dirty.clear();
    if (this.stickToBottom) this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  private view(m: Message): View {
    let v = this.views.get(m.id);
    if (!v) {
      const body = h("div", { class: "msg-body" });
      const meta = h("div", { class: "msg-meta" });
      const actions = h("div", { class: "msg-actions" });
      const thinkingLabel = h("span", { class: "thinking-label" });
      const thinkingBody = h("div", { class: "thinking-body" });
      const id = m.id;
      const thinking = h(
        "details",
        { class: "thinking" },
        // The reader's own click decides from then on (the toggle event cannot tell it from ours).
        h("summary", { on: { click: () => this.thinkingChoice.set(id, !thinking.open) } }, thinkingLabel),
        thinkingBody,
      );
      thinking.hidden = true;
      const root = h("article", { class: `msg msg-${m.role}`, attrs: { "data-id": String(m.id) } }, thinking, body, meta, actions);
      v = { root, thinking, thinkingLabel, thinkingBody, body, meta, actions };
      this.views.set(m.id, v);
    }
    return v;
  }

  private paint(m: Message, isLastReply: boolean): void {
    const v = this.view(m);
    v.root.dataset.status = m.status;
    if (this.editing === m.id) return;
    const calls = m.tool_calls ?? [];
    if (m.role === "assistant") {
      this.paintThinking(m, v);
      if (m.text) v.body.replaceChildren(renderMarkdown(m.text));
      else if (calls.length || m.thinking) v.body.replaceChildren();
      else v.body.replaceChildren(h("span", { class: "typing", attrs: { "aria-label": "waiting for the reply" } }, h("i"), h("i"), h("i")));
      v.body.append(...calls.map((c) => this.callBlock(c)));
    } else if (m.role === "tool") {
      const id = m.tool_call_id ?? "";
      const call = this.callById(id);
      v.body.replaceChildren(
        h("div", { class: "tool-head" }, "Result of ", h("code", { class: "tool-name", text: call?.name ?? "a tool call" }), h("span", { class: "tool-id", text: id })),
        h("pre", { class: "tool-result" }, h("code", { text: pretty(m.text) ?? m.text })),
      );
    } else {
      v.body.textContent = m.text; // user text is shown verbatim, never parsed
    }
    this.paintMeta(m, v.meta);
    this.paintActions(m, v.actions, isLastReply);
  }

  private paintThinking(m: Message, v: View): void {
    const thinking = m.thinking ?? "";
    v.thinking.hidden = !thinking;
    if (!thinking) return;
    const thinkingNow = m.status === "streaming" && !m.text;
    v.thinking.open = this.thinkingChoice.get(m.id) ?? thinkingNow;
    v.thinking.dataset.state = thinkingNow ? "thinking" : "done";
    const info = this.live.get(m.id);
    // The stored figure, else this page's own clock: while it thinks, or until the answer began.
    let seconds = m.stats?.thinking_s ?? undefined;
    const end = thinkingNow ? performance.now() : info?.firstTextAt;
    if (seconds == null && info?.firstThinkingAt !== undefined && end !== undefined) seconds = (end - info.firstThinkingAt) / 1000;
    const secs = seconds == null ? "" : `${seconds < 10 ? seconds.toFixed(1) : seconds.toFixed(0)} s`;
    if (thinkingNow) v.thinkingLabel.textContent = secs ? `Thinking… ${secs}` : "Thinking…";
    else v.thinkingLabel.textContent = secs ? `Thought for ${secs}` : "Thought";
    v.thinkingBody.replaceChildren(renderMarkdown(thinking));
  }

  private callBlock(c: ToolCall): HTMLElement {
    const args = pretty(c.arguments);
    const answered = this.messages.some((x) => x.role === "tool" && x.tool_call_id === c.id);
    return h(
      "div",
      { class: "tool-call", attrs: { "data-call-id": c.id, "data-answered": String(answered) } },
      h("div", { class: "tool-head" }, "Tool call ", h("code", { class: "tool-name", text: c.name }), h("span", { class: "tool-id", text: c.id })),
      h("pre", { class: "tool-args" }, h("code", { text: args ?? c.arguments })),
      args === null ? h("div", { class: "tool-note", text: "arguments are not valid JSON (shown as written)" }) : null,
      answered ? null : h("div", { class: "tool-note", text: "no result in this conversation" }),
    );
  }

  private callById(id: string): ToolCall | undefined {
    for (const m of this.messages) for (const c of m.tool_calls ?? []) if (c.id === id) return c;
    return undefined;
  }

  private paintMeta(m: Message, meta: HTMLElement): void {
    meta.replaceChildren();
    if (m.role !== "assistant") return;
    const info = this.live.get(m.id);
    if (m.status === "streaming") {
      let line: string;
      if (info?.queued !== undefined && info.startedAt === undefined) line = `Queued — position ${info.queued}`;
      else if (info?.firstThinkingAt !== undefined && info.firstTextAt === undefined) line = "Thinking…";
      else if (info?.startedAt !== undefined && info.firstTextAt === undefined)
        line = `Reading the prompt${info.promptTokens ? ` (${info.promptTokens} tokens)` : ""}…`;
      else if (info?.startedAt !== undefined) {
        const s = ((performance.now() - info.startedAt) / 1000).toFixed(1);
        line = `Generating… ${s} s`;
      } else line = "Waiting for the engine…";
      meta.append(h("span", { class: "live", text: line }));
      return;
    }
    if (m.status === "interrupted") meta.append(h("span", { class: "badge badge-warn", text: "Interrupted" }));
    if (m.status === "error") meta.append(h("span", { class: "badge badge-error", text: "Failed" }));
    const atlasHref = this.handlers.staff ? `/atlas?message=${m.id}` : undefined;
    for (const p of statsParts(m.stats, atlasHref)) {
      const label = h("span", { class: "stat-label", text: p.label });
      const stat = p.href
        ? h("a", { class: "stat stat-link", title: "open the expert atlas filtered to the experts that answered this reply",
            attrs: { href: p.href, target: "_blank", rel: "noopener" } }, label, ` ${p.value}`)
        : h("span", { class: p.warn ? "stat stat-warn" : "stat", title: p.label }, label, ` ${p.value}`);
      meta.append(stat);
    }
    if (info?.error && info.error.code !== "CANCELLED")
      meta.append(h("div", { class: "msg-error", attrs: { role: "alert" }, text: errorMessage(info.error.code, info.error.detail) }));
  }

  private paintActions(m: Message, actions: HTMLElement, isLastReply: boolean): void {
    actions.replaceChildren();
    if (m.status === "streaming") return;
    const enabled = this.handlers.canAct();
    if (m.role === "tool") {
      if (isLastReply && enabled)
        actions.append(
          h("button", { class: "link-btn", text: "Continue", title: "generate the reply to this result", attrs: { type: "button" }, on: { click: () => this.handlers.regenerate() } }),
        );
    } else if (m.role === "assistant") {
      if (m.text)
        actions.append(
          h("button", {
            class: "link-btn",
            text: "Copy",
            attrs: { type: "button" },
            on: { click: () => void navigator.clipboard?.writeText(m.text) },
          }),
        );
      if (isLastReply && enabled)
        actions.append(
          h("button", { class: "link-btn", text: "Regenerate", attrs: { type: "button" }, on: { click: () => this.handlers.regenerate() } }),
        );
    } else if (m.role === "user" && enabled) {
      actions.append(h("button", { class: "link-btn", text: "Edit", attrs: { type: "button" }, on: { click: () => this.startEdit(m) } }));
    }
  }

  private startEdit(m: Message): void {
    const v = this.view(m);
    this.editing = m.id;
    const area = h("textarea", { class: "edit-area", attrs: { rows: "3", "aria-label": "Edit message" } });
    area.value = m.text;
    const done = () => {
      this.editing = null;
      this.markDirty(m.id);
    };
    v.body.replaceChildren(
      area,
      h(
        "div",
        { class: "edit-buttons" },
        h("button", { class: "btn", text: "Cancel", attrs: { type: "button" }, on: { click: done } }),
        h("button", {
          class: "btn btn-primary",
          text: "Save & resend",
          attrs: { type: "button" },
          on: {
            click: () => {
              const text = area.value.trim();
              if (!text) return;
              this.editing = null;
              this.handlers.edit(m, text);
            },
          },
        }),
      ),
    );
    v.actions.replaceChildren();
    area.focus();
  }
}

// JSON text pretty-printed with two-space indents, or null when it is not JSON.
function pretty(text: string): string | null {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return null;
  }
}
