// Conversation list: new, import (an API conversation's JSON file), select, rename (inline),
// delete (confirmed), search by title.
import type { Conversation } from "../api";
import { h } from "./dom";
import { relativeDay } from "./format";

export interface SidebarHandlers {
  select(id: number): void;
  create(): void;
  importFile(file: File): void;
  rename(id: number, title: string): Promise<void>;
  remove(id: number): Promise<void>;
  search(query: string): void;
}

export class Sidebar {
  private list: HTMLUListElement;
  private search: HTMLInputElement;
  private items: Conversation[] = [];
  private current: number | null = null;
  private renaming: number | null = null;
  private searchTimer: number | undefined;

  constructor(
    root: HTMLElement,
    private handlers: SidebarHandlers,
  ) {
    this.search = h("input", {
      class: "search",
      attrs: { type: "search", placeholder: "Search chats", "aria-label": "Search chats by title" },
      on: {
        input: () => {
          window.clearTimeout(this.searchTimer);
          this.searchTimer = window.setTimeout(() => handlers.search(this.search.value.trim()), 200);
        },
      },
    });
    this.list = h("ul", { class: "conv-list", attrs: { "aria-label": "Conversations" } });
    const file = h("input", {
      class: "import-file",
      attrs: { type: "file", accept: ".json,application/json", hidden: "", "aria-label": "Import a conversation (JSON)" },
      on: {
        change: () => {
          const f = file.files?.[0];
          file.value = ""; // the same file can be picked again
          if (f) handlers.importFile(f);
        },
      },
    });
    root.append(
      h("button", { class: "btn btn-primary new-chat", text: "+ New chat", attrs: { type: "button" }, on: { click: () => handlers.create() } }),
      h(
        "label",
        { class: "btn import-chat", title: "Open an API conversation: a JSON file with the messages of an OpenAI Chat request, tool calls included" },
        "Import JSON",
        file,
      ),
      this.search,
      this.list,
    );
  }

  get query(): string {
    return this.search.value.trim();
  }

  setItems(items: Conversation[]): void {
    this.items = items.slice().sort((a, b) => (a.updated < b.updated ? 1 : a.updated > b.updated ? -1 : b.id - a.id));
    this.render();
  }

  upsert(c: Conversation): void {
    const i = this.items.findIndex((x) => x.id === c.id);
    if (i >= 0) this.items[i] = { ...this.items[i], ...c };
    else if (!this.query) this.items.unshift(c);
    this.setItems(this.items);
  }

  setTitle(id: number, title: string): void {
    const c = this.items.find((x) => x.id === id);
    if (c) {
      c.title = title;
      this.render();
    }
  }

  drop(id: number): void {
    this.items = this.items.filter((x) => x.id !== id);
    this.render();
  }

  setCurrent(id: number | null): void {
    this.current = id;
    this.render();
  }

  private render(): void {
    this.list.replaceChildren(...this.items.map((c) => this.item(c)));
    if (!this.items.length)
      this.list.append(h("li", { class: "conv-empty", text: this.query ? "No chats match." : "No chats yet." }));
  }

  private item(c: Conversation): HTMLLIElement {
    const title = c.title || "New chat";
    if (this.renaming === c.id) {
      const input = h("input", { class: "rename", attrs: { value: title, "aria-label": "New title" } });
      const finish = async (save: boolean) => {
        if (this.renaming !== c.id) return;
        this.renaming = null;
        const next = input.value.trim();
        if (save && next && next !== c.title) await this.handlers.rename(c.id, next);
        this.render();
      };
      input.addEventListener("keydown", (e) => {
        if (e.key === "Enter") void finish(true);
        if (e.key === "Escape") {
          e.preventDefault(); // the rename is cancelled, not the drawer it sits in
          void finish(false);
        }
      });
      input.addEventListener("blur", () => void finish(true));
      window.setTimeout(() => input.select(), 0);
      return h("li", { class: "conv conv-active" }, input);
    }
    const li = h(
      "li",
      { class: c.id === this.current ? "conv conv-active" : "conv", attrs: { "data-id": String(c.id) } },
      h(
        "button",
        { class: "conv-open", attrs: { type: "button" }, title, on: { click: () => this.handlers.select(c.id) } },
        h("span", { class: "conv-title", text: title }),
        h("span", { class: "conv-date", text: relativeDay(c.updated) }),
      ),
      h(
        "span",
        { class: "conv-actions" },
        h("button", {
          class: "icon-btn",
          text: "✎",
          title: "Rename",
          attrs: { type: "button", "aria-label": `Rename ${title}` },
          on: {
            click: () => {
              this.renaming = c.id;
              this.render();
            },
          },
        }),
        h("button", {
          class: "icon-btn danger",
          text: "✕",
          title: "Delete",
          attrs: { type: "button", "aria-label": `Delete ${title}` },
          on: {
            click: () => {
              if (window.confirm(`Delete “${title}”? This cannot be undone.`)) void this.handlers.remove(c.id);
            },
          },
        }),
      ),
    );
    return li;
  }
}
