// The composer: an auto-growing textarea, Send, Stop, and the sampling controls (kept in localStorage).
// Enter never stops a reply: Stop is its own button, shown while a reply streams. Enter (or Send)
// while a reply streams keeps the typed message in the box, as ChatGPT's composer does, and says
// so; once the reply ends, Enter sends it. (Queueing it for automatic sending was the other way
// the issue allowed; a message that leaves later on its own is easier to miss or regret.)
import type { ExpertRange, GenParams, SamplingDefaults } from "../api";
import { h } from "./dom";

const STORE_KEY = "colibri.params";
export const DEFAULT_PARAMS: GenParams = { max_tokens: 512 };
// Until /health says what the served model recommends; the server applies the real one either way,
// because a temperature or top_p the user never chose is not sent.
const FALLBACK_SAMPLING: SamplingDefaults = { temperature: 0.7, top_p: 1 };

function loadParams(): GenParams {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE_KEY) || "{}") as Partial<GenParams>;
    // Earlier versions stored the old fixed defaults with every change: those were not choices.
    if (saved.temperature === 0.7 && saved.top_p === 1) {
      delete saved.temperature;
      delete saved.top_p;
    }
    return { ...DEFAULT_PARAMS, ...saved };
  } catch {
    return { ...DEFAULT_PARAMS };
  }
}

type SamplingKey = "temperature" | "top_p";

export interface ComposerHandlers {
  send(text: string): void;
  stop(): void;
}

export class Composer {
  params: GenParams = loadParams();
  private area: HTMLTextAreaElement;
  private expertsControl: HTMLElement | null = null;
  private expertRange: ExpertRange | null = null;
  private button: HTMLButtonElement;
  private stopButton: HTMLButtonElement;
  private hint: HTMLElement;
  private busy = false;

  constructor(root: HTMLElement, settingsRoot: HTMLElement, private handlers: ComposerHandlers) {
    this.area = h("textarea", {
      class: "composer-input",
      attrs: { rows: "1", placeholder: "Message colibri…  (Enter to send, Shift+Enter for a new line)", "aria-label": "Message", enterkeyhint: "send" },
      on: {
        input: () => this.autosize(),
        keydown: (e) => {
          if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            this.submit();
          }
        },
      },
    });
    this.button = h("button", { class: "btn btn-primary send", text: "Send", attrs: { type: "button", "aria-label": "Send message" }, on: { click: () => this.submit() } });
    this.stopButton = h("button", {
      class: "btn btn-stop stop",
      text: "Stop",
      attrs: { type: "button", "aria-label": "Stop generating" },
      on: { click: () => this.handlers.stop() },
    });
    this.stopButton.hidden = true;
    // Polite: says why Enter did not send, without taking focus from the box.
    this.hint = h("div", { class: "composer-hint", attrs: { role: "status", "aria-live": "polite" } });
    root.append(h("div", { class: "composer-box" }, this.area, this.stopButton, this.button), this.hint);
    settingsRoot.append(...this.controls());
    this.settingsRoot = settingsRoot;
  }

  private settingsRoot: HTMLElement;
  private sampling: SamplingDefaults = FALLBACK_SAMPLING;
  private samplingViews: (() => void)[] = [];

  // The served model's recommended temperature / top_p: what the sliders show until moved.
  setSamplingDefaults(sampling: SamplingDefaults): void {
    if (sampling.temperature === this.sampling.temperature && sampling.top_p === this.sampling.top_p) return;
    this.sampling = sampling;
    for (const refresh of this.samplingViews) refresh();
  }

  // Quality <-> speed: how many routed experts each token uses. Shown only when the served model
  // takes a per-request count; a saved count outside its range is dropped (the model changed).
  setExpertRange(range: ExpertRange | null): void {
    const same = JSON.stringify(range) === JSON.stringify(this.expertRange);
    if (same) return;
    this.expertRange = range;
    this.expertsControl?.remove();
    this.expertsControl = null;
    const saved = this.params.experts;
    if (!range || (saved !== undefined && (saved < range.min || saved > range.max))) {
      this.setParams({ ...this.params, experts: undefined });
    }
    if (range) {
      this.expertsControl = this.expertsSlider(range);
      this.settingsRoot.append(this.expertsControl);
    }
  }

  private setParams(params: GenParams): void {
    this.params = params;
    localStorage.setItem(STORE_KEY, JSON.stringify(this.params));
  }

  private expertsSlider(range: ExpertRange): HTMLElement {
    const describe = () => {
      const n = this.params.experts ?? range.default;
      return `${n} of ${range.max}${this.params.experts === undefined ? " (model default)" : ""}`;
    };
    const out = h("output", { class: "param-value", text: describe() });
    const input = h("input", {
      attrs: { type: "range", min: String(range.min), max: String(range.max), step: "1", name: "experts", "aria-label": "Experts per token" },
      on: {
        input: () => {
          const v = Math.round(Number(input.value));
          if (!Number.isFinite(v)) return;
          this.setParams({ ...this.params, experts: v === range.default ? undefined : v });
          out.textContent = describe();
        },
      },
    });
    input.value = String(this.params.experts ?? range.default);
    return h(
      "label",
      { class: "param param-experts", title: "More experts per token: closer to the full model's answers, slower. Fewer: faster." },
      h("span", { class: "param-name", text: "Experts (speed ↔ quality)" }),
      input,
      out,
    );
  }

  focus(): void {
    this.area.focus();
  }

  // While a reply streams: Stop shows, Send waits (the typed text stays in the box).
  setBusy(busy: boolean): void {
    if (busy === this.busy) return;
    this.busy = busy;
    this.stopButton.hidden = !busy;
    this.button.disabled = busy;
    this.button.title = busy ? "Wait for the reply to finish, or stop it" : "";
    if (!busy) this.hint.textContent = "";
  }

  private submit(): void {
    const text = this.area.value.trim();
    if (!text) return;
    if (this.busy) {
      this.hint.textContent = "The reply is still being written: your message stays here. Press Enter once it ends, or Stop it.";
      return;
    }
    this.area.value = "";
    this.autosize();
    this.handlers.send(text);
  }

  private autosize(): void {
    this.area.style.height = "auto";
    this.area.style.height = `${Math.min(this.area.scrollHeight, 240)}px`;
  }

  private controls(): HTMLElement[] {
    return [
      this.samplingSlider("temperature", "Temperature", 0, 2, 0.05, "0 = always the most likely token; higher = more varied"),
      this.samplingSlider("top_p", "Top p", 0.05, 1, 0.05, "Sample only from the smallest set of tokens whose probability adds up to p"),
      this.maxTokensField(),
    ];
  }

  // A value equal to the model's default is not a choice: it is not stored and not sent, so the
  // server keeps applying the served model's recommendation (also after the model changes).
  private samplingSlider(key: SamplingKey, label: string, min: number, max: number, step: number, hint: string): HTMLElement {
    const out = h("output", { class: "param-value" });
    const input = h("input", {
      attrs: { type: "range", min: String(min), max: String(max), step: String(step), name: key, "aria-label": label },
      on: {
        input: () => {
          const v = Number(input.value);
          if (!Number.isFinite(v)) return;
          const chosen = Math.min(max, Math.max(min, v));
          this.setParams({ ...this.params, [key]: chosen === this.sampling[key] ? undefined : chosen });
          refresh();
        },
      },
    });
    const refresh = () => {
      const chosen = this.params[key];
      input.value = String(chosen ?? this.sampling[key]);
      out.textContent = chosen === undefined ? `${this.sampling[key]} (model default)` : String(chosen);
    };
    refresh();
    this.samplingViews.push(refresh);
    return h("label", { class: "param", title: hint }, h("span", { class: "param-name", text: label }), input, out);
  }

  private maxTokensField(): HTMLElement {
    const input = h("input", {
      attrs: { type: "number", min: "1", max: "32768", step: "1", name: "max_tokens", "aria-label": "Max tokens" },
      on: {
        input: () => {
          const v = Number(input.value);
          if (!Number.isFinite(v)) return;
          this.setParams({ ...this.params, max_tokens: Math.min(32768, Math.max(1, Math.round(v))) });
        },
      },
    });
    input.value = String(this.params.max_tokens);
    return h("label", { class: "param", title: "Longest reply, in tokens" }, h("span", { class: "param-name", text: "Max tokens" }), input);
  }
}
