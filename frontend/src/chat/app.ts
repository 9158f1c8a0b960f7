// Wires the socket and HTTP client to the sidebar, message pane, composer and status strip.
// The server is the source of truth: every "open" is answered with a snapshot, deltas carry the
// offset of their text, and a gap triggers a fresh snapshot instead of guessing.
import { ChatSocket, type ConversationPatch, Http, type Message, type ServerEvent } from "../api";
import { Composer } from "./composer";
import { byId } from "./dom";
import { Drawer, trackViewport } from "./drawer";
import { errorMessage } from "./format";
import { KeysDialog } from "./keys";
import { MessagePane } from "./pane";
import { ModelPicker } from "./picker";
import { Sidebar } from "./sidebar";
import { StatusBar } from "./status";
import { SystemPromptField } from "./sysprompt";

export interface Boot {
  username: string;
  csrf_token: string;
  is_staff?: boolean;
}

export class ChatApp {
  private http: Http;
  private socket = new ChatSocket();
  private sidebar: Sidebar;
  private pane: MessagePane;
  private composer: Composer;
  private status: StatusBar;
  private keys: KeysDialog;
  private drawer: Drawer;
  private picker: ModelPicker;
  private systemPrompt: SystemPromptField;
  private settingsOf: number | null = null; // the conversation whose model / system prompt are on screen
  private current: number | null = null;
  private awaitingNew = false; // a "send" with conversation null is on its way
  private titles = new Map<number, string>();

  constructor(boot: Boot) {
    this.http = new Http(boot.csrf_token);
    this.status = new StatusBar(byId("notices"), byId("engine-status"), this.http, (health) => {
      this.composer?.setExpertRange(health.experts);
      if (health.sampling) this.composer?.setSamplingDefaults(health.sampling);
      void this.refreshModels();
    });
    this.drawer = new Drawer(byId("sidebar"), byId("menu-toggle"), byId("drawer-scrim"), byId("chat-main"));
    this.sidebar = new Sidebar(byId("conv-nav"), {
      select: (id) => {
        this.drawer.close(false);
        this.select(id);
      },
      create: () => {
        this.drawer.close(false);
        this.select(null);
      },
      importFile: (file) => void this.importFile(file),
      rename: (id, title) => this.rename(id, title),
      remove: (id) => this.remove(id),
      search: (q) => void this.loadList(q),
    });
    this.pane = new MessagePane(byId("scroller"), byId("messages"), {
      regenerate: () => this.regenerate(),
      edit: (m, text) => this.edit(m, text),
      canAct: () => !this.pane.streaming && this.socket.state === "open",
      staff: boot.is_staff === true,
    });
    this.composer = new Composer(byId("composer"), byId("settings"), {
      send: (text) => this.send(text),
      stop: () => this.stop(),
    });
    this.keys = new KeysDialog(this.http);
    this.picker = new ModelPicker(byId("model-slot"), (model) => void this.configure({ model }));
    this.systemPrompt = new SystemPromptField(byId("settings"), (text) => void this.configure({ system_prompt: text }));

    byId("keys-open").addEventListener("click", () => {
      // Focus first to the menu button: the dialog hands focus back to it when it closes (the
      // keys button itself is hidden with the drawer by then).
      this.drawer.close();
      void this.keys.show();
    });
    const settings = byId("settings");
    const settingsToggle = byId("settings-toggle");
    const showSettings = (show: boolean) => {
      settings.hidden = !show;
      settingsToggle.setAttribute("aria-expanded", String(show));
    };
    settingsToggle.addEventListener("click", () => showSettings(settings.hidden));
    // Escape folds the settings away, unless the drawer's handler (registered first) took it or a
    // dialog is open (its Escape is its own).
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape" || e.defaultPrevented || settings.hidden || document.querySelector("dialog[open]")) return;
      showSettings(false);
      settingsToggle.focus();
    });
    window.addEventListener("hashchange", () => this.select(this.idFromHash(), false));

    this.socket.onEvent((ev) => this.handle(ev));
    this.socket.onState((s) => {
      this.status.setConnection(s);
      this.pane.refreshAll();
    });
    this.socket.connect();
    void this.loadList("");
    this.select(this.idFromHash(), false);
  }

  private idFromHash(): number | null {
    const m = /^#c\/(\d+)$/.exec(location.hash);
    return m ? Number(m[1]) : null;
  }

  private select(id: number | null, pushHash = true): void {
    if (id === this.current && id !== null) {
      this.composer.focus(); // the drawer that offered it is closed: focus must land somewhere
      return;
    }
    this.current = id;
    this.awaitingNew = false;
    this.pane.clear();
    this.sidebar.setCurrent(id);
    this.updateChrome();
    if (pushHash) history.replaceState(null, "", id === null ? location.pathname : `#c/${id}`);
    this.showSettingsOf(id);
    if (id === null) this.socket.unsubscribeAll();
    else this.socket.open(id);
    this.composer.focus();
  }

  private async loadList(query: string): Promise<void> {
    try {
      const items = await this.http.listConversations(query);
      for (const c of items) this.titles.set(c.id, c.title);
      this.sidebar.setItems(items);
      this.updateChrome();
    } catch (e) {
      this.status.flash(`Could not load conversations: ${(e as Error).message}`);
    }
  }

  private async refreshModels(): Promise<void> {
    try {
      this.picker.setModels(await this.http.listModels());
    } catch {
      /* the status strip reports an unreachable server; the picker keeps the list it had */
    }
  }

  // The model and system prompt of the conversation on screen (a New chat: the default, none).
  private showSettingsOf(id: number | null): void {
    this.picker.setValue("");
    this.systemPrompt.setText("");
    this.settingsOf = null;
    if (id === null) return;
    void this.http.getConversation(id).then(
      (c) => {
        if (this.current !== id) return;
        this.picker.setValue(c.model ?? "");
        this.systemPrompt.setText(c.system_prompt ?? "");
        this.settingsOf = id;
      },
      (e: Error) => this.status.flash(`Could not load this conversation's settings: ${e.message}`),
    );
  }

  // A New chat keeps the choice until its first message carries it; a conversation stores it now.
  private async configure(patch: ConversationPatch): Promise<void> {
    const id = this.current;
    if (id === null) return;
    try {
      await this.http.updateConversation(id, patch);
    } catch (e) {
      this.status.flash(`Could not change this conversation's settings: ${(e as Error).message}`);
      if (this.current === id) this.showSettingsOf(id); // back to what is stored
    }
  }

  private async rename(id: number, title: string): Promise<void> {
    try {
      const c = await this.http.renameConversation(id, title);
      this.sidebar.setTitle(id, c.title ?? title);
      this.titles.set(id, c.title ?? title);
      this.updateChrome();
    } catch (e) {
      this.status.flash(`Could not rename: ${(e as Error).message}`);
    }
  }

  private async importFile(file: File): Promise<void> {
    let body: unknown;
    try {
      body = JSON.parse(await file.text());
    } catch {
      this.status.flash(`Could not import ${file.name}: it is not JSON.`);
      return;
    }
    try {
      const c = await this.http.importConversation(body);
      this.titles.set(c.id, c.title);
      this.sidebar.upsert(c);
      this.select(c.id);
    } catch (e) {
      this.status.flash(`Could not import ${file.name}: ${(e as Error).message}`);
    }
  }

  private async remove(id: number): Promise<void> {
    try {
      await this.http.deleteConversation(id);
      this.sidebar.drop(id);
      if (id === this.current) this.select(null);
    } catch (e) {
      this.status.flash(`Could not delete: ${(e as Error).message}`);
    }
  }

  private send(text: string): void {
    if (this.current === null) this.awaitingNew = true;
    // The settings travel with the message too (an edit not yet stored, its field still focused,
    // is applied before this turn renders, in the same transaction), but only once they are the
    // conversation's own: a send before its settings arrived must not overwrite them with blanks.
    const settings = this.current === null || this.settingsOf === this.current
      ? { model: this.picker.current, system_prompt: this.systemPrompt.text } : {};
    this.socket.send({ type: "send", conversation: this.current, text, params: this.composer.params, ...settings });
    this.composer.setBusy(true); // until the server's "message" events say otherwise
  }

  private stop(): void {
    if (this.current !== null) this.socket.send({ type: "stop", conversation: this.current });
  }

  private regenerate(): void {
    if (this.current === null) return;
    const last = this.pane.messages[this.pane.messages.length - 1];
    if (last?.role === "assistant") this.pane.truncateFrom(last.id);
    this.socket.send({ type: "regenerate", conversation: this.current, params: this.composer.params });
    this.composer.setBusy(true);
  }

  private edit(m: Message, text: string): void {
    if (this.current === null) return;
    this.pane.truncateFrom(m.id + 1);
    this.pane.upsert({ ...m, text });
    this.socket.send({ type: "edit", conversation: this.current, message: m.id, text, params: this.composer.params });
    this.composer.setBusy(true);
  }

  private adopt(conversation: number): void {
    // The first event about a conversation we just started by sending into "New chat".
    if (this.awaitingNew && this.current === null) {
      this.awaitingNew = false;
      this.current = conversation;
      this.settingsOf = conversation; // created with the settings on screen
      history.replaceState(null, "", `#c/${conversation}`);
      this.sidebar.setCurrent(conversation);
      this.updateChrome();
    }
  }

  private handle(ev: ServerEvent): void {
    switch (ev.type) {
      case "conversation":
        this.titles.set(ev.conversation.id, ev.conversation.title);
        this.sidebar.upsert(ev.conversation);
        this.adopt(ev.conversation.id);
        this.updateChrome();
        break;
      case "title":
        this.titles.set(ev.conversation, ev.title);
        this.sidebar.setTitle(ev.conversation, ev.title);
        this.updateChrome();
        break;
      case "snapshot":
        if (ev.conversation !== this.current) return;
        this.pane.setMessages(ev.messages);
        break;
      case "message":
      case "done":
        this.adopt(ev.message.conversation);
        if (ev.message.conversation !== this.current) return;
        this.pane.upsert(ev.message);
        break;
      case "queued":
        this.pane.setLive(ev.message, { queued: ev.position });
        break;
      case "started":
        this.pane.setLive(ev.message, { startedAt: performance.now(), promptTokens: ev.prompt_tokens });
        break;
      case "delta":
        if (!this.pane.applyDelta(ev.message, ev.offset, ev.text) && this.current !== null) this.socket.open(this.current);
        break;
      case "thinking":
        if (!this.pane.applyThinking(ev.message, ev.offset, ev.text) && this.current !== null) this.socket.open(this.current);
        break;
      case "error":
        this.onError(ev.message, ev.code, ev.detail);
        break;
    }
    this.composer.setBusy(this.pane.streaming !== undefined || (this.awaitingNew && ev.type !== "error"));
    this.updateChrome();
  }

  private onError(message: number | null, code: string, detail: string): void {
    if (code.startsWith("ENGINE")) this.status.pollSoon();
    if (message !== null && this.pane.messages.some((m) => m.id === message)) {
      this.pane.setLive(message, { error: { code, detail } });
    } else if (code !== "CANCELLED") {
      this.status.flash(errorMessage(code, detail));
    }
    this.awaitingNew = false;
  }

  private updateChrome(): void {
    const title = this.current === null ? "New chat" : this.titles.get(this.current) || "New chat";
    byId("chat-title").textContent = title;
    document.title = `${title} · colibri`;
    byId("empty").hidden = this.pane.messages.length > 0;
  }
}

export function mount(): void {
  const boot = JSON.parse(byId("colibri-boot").textContent || "{}") as Boot;
  byId("user-name").textContent = boot.username;
  trackViewport();
  new ChatApp(boot);
}
