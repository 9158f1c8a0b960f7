// The conversation's system prompt, in the settings panel: a textarea whose text is the first
// (system) message of every turn's prompt (chat/services.py). The app sets it when a conversation
// opens and stores an edit when the field loses focus (or is left unchanged: nothing is sent);
// for a New chat the text travels with the first message.
import { h } from "./dom";

export const SYSTEM_PROMPT_CHARS = 20000; // chat/models.py SYSTEM_PROMPT_CHARS

export class SystemPromptField {
  private area: HTMLTextAreaElement;
  private saved = "";

  constructor(root: HTMLElement, private onCommit: (text: string) => void) {
    this.area = h("textarea", {
      class: "system-prompt",
      attrs: {
        name: "system_prompt", rows: "2", maxlength: String(SYSTEM_PROMPT_CHARS), "aria-label": "System prompt",
        placeholder: "System prompt for this conversation (optional), e.g. “Answer in French.”",
      },
      on: { change: () => this.commit() },
    });
    root.append(h("label", { class: "param param-system", title: "Sent before the conversation, as its system message" },
      h("span", { class: "param-name", text: "System prompt" }), this.area));
  }

  get text(): string {
    return this.area.value;
  }

  // The stored text of the conversation now on screen ("" for a New chat).
  setText(text: string): void {
    this.saved = text;
    this.area.value = text;
  }

  private commit(): void {
    if (this.area.value === this.saved) return;
    this.saved = this.area.value;
    this.onCommit(this.saved);
  }
}
