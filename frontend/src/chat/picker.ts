// The model picker in the header's #model-slot (issue 26 item 3): a select of the models the live
// bridges serve (GET /api/models), "Default" first (a conversation with no model of its own). Its
// value is the conversation's, set by the app when a conversation opens; a change is reported to
// the app, which stores it (PATCH) or, for a New chat, sends it with the first message.
// Invariant: a conversation's model that is no longer served stays shown (marked), never silently
// replaced by another.
import type { ModelList } from "../api";
import { h } from "./dom";

export class ModelPicker {
  private select: HTMLSelectElement;
  private list: ModelList = { default: null, models: [] };
  private value = "";

  constructor(slot: HTMLElement, private onChange: (model: string) => void) {
    this.select = h("select", {
      class: "model-picker",
      attrs: { name: "model", "aria-label": "Model", title: "The model this conversation's replies come from" },
      on: { change: () => this.chosen() },
    });
    slot.append(h("label", { class: "model-label" }, h("span", { class: "param-name", text: "Model" }), this.select));
    slot.hidden = false;
    this.render();
  }

  get current(): string {
    return this.value;
  }

  setModels(list: ModelList): void {
    if (JSON.stringify(list) === JSON.stringify(this.list)) return;
    this.list = list;
    this.render();
  }

  setValue(model: string): void {
    this.value = model;
    this.render();
  }

  private chosen(): void {
    this.value = this.select.value;
    this.onChange(this.value);
  }

  private render(): void {
    const def = this.list.default;
    const options = [h("option", { text: def ? `Default (${def})` : "Default model", attrs: { value: "" } })];
    for (const m of this.list.models) {
      const note = m.status === "up" ? "" : ` (${m.status})`;
      options.push(h("option", { text: `${m.id}${note}`, title: m.display_name, attrs: { value: m.id } }));
    }
    if (this.value && !this.list.models.some((m) => m.id === this.value))
      options.push(h("option", { text: `${this.value} (not served now)`, attrs: { value: this.value } }));
    this.select.replaceChildren(...options);
    this.select.value = this.value;
  }
}
