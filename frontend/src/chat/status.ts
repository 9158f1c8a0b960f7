// The notice strip above the messages: connection lost, engine restarting / down (from /health),
// and errors that belong to no message. Health is polled often while something is wrong.
import type { ConnectionState, Health, Http } from "../api";
import { h } from "./dom";

export class StatusBar {
  private conn: ConnectionState = "connecting";
  private health: Health = { ok: true, state: "ok", reason: "", experts: null };
  private notice = "";
  private noticeTimer: number | undefined;
  private pollTimer: number | undefined;
  private badge: HTMLElement;

  constructor(
    private strip: HTMLElement,
    badgeRoot: HTMLElement,
    private http: Http,
    private onHealth: (health: Health) => void = () => {},
  ) {
    this.badge = h("span", { class: "engine-badge", attrs: { role: "status" } });
    badgeRoot.append(this.badge);
    void this.poll();
  }

  setConnection(s: ConnectionState): void {
    const wasOpen = this.conn === "open";
    this.conn = s;
    if (s === "closed" || (s === "open" && !wasOpen)) this.pollSoon();
    this.render();
  }

  // An error that belongs to no message: shown for a while, then cleared.
  flash(text: string, ms = 8000): void {
    this.notice = text;
    window.clearTimeout(this.noticeTimer);
    this.noticeTimer = window.setTimeout(() => {
      this.notice = "";
      this.render();
    }, ms);
    this.render();
  }

  pollSoon(): void {
    window.clearTimeout(this.pollTimer);
    this.pollTimer = window.setTimeout(() => void this.poll(), 300);
  }

  private async poll(): Promise<void> {
    window.clearTimeout(this.pollTimer);
    this.health = await this.http.health();
    this.onHealth(this.health);
    this.render();
    this.pollTimer = window.setTimeout(() => void this.poll(), this.health.ok ? 15000 : 3000);
  }

  private render(): void {
    const lines: { cls: string; text: string }[] = [];
    if (this.conn === "closed") lines.push({ cls: "notice-warn", text: "Connection lost — reconnecting…" });
    if (!this.health.ok) {
      const restarting = /restart|start/.test(this.health.state);
      const text = restarting
        ? "The engine is restarting — replies will resume in a moment."
        : `The engine is down${this.health.reason ? `: ${this.health.reason}` : ""}. New messages will fail until it is back.`;
      lines.push({ cls: restarting ? "notice-warn" : "notice-error", text });
    }
    if (this.notice) lines.push({ cls: "notice-error", text: this.notice });
    this.strip.replaceChildren(...lines.map((l) => h("div", { class: `notice ${l.cls}`, attrs: { role: "alert" }, text: l.text })));
    const up = this.health.ok && this.conn === "open";
    this.badge.className = `engine-badge ${up ? "engine-up" : this.conn === "open" ? "engine-down" : "engine-wait"}`;
    this.badge.textContent = up ? "engine ready" : !this.health.ok ? `engine ${this.health.state}` : "connecting";
    this.badge.title = this.badge.textContent; // on a phone only the dot shows (styles/app.css)
  }
}
