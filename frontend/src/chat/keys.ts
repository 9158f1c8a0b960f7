// API keys dialog: create (the secret is shown once, with ready-to-paste snippets for curl, the
// openai SDK — plain and with a tool call — and the anthropic SDK that carry it, the base URL and
// the model id), list, revoke.
import { ApiError, type ApiKey, type Http } from "../api";
import { h } from "./dom";

// The create answer also says where the API is: base_url (OpenAI style, ends in /v1; the
// Anthropic SDK takes the origin) and the model id to type.
type CreatedKey = ApiKey & { base_url?: string; model?: string };

export function snippets(key: string, baseUrl: string, model: string): { label: string; code: string }[] {
  const origin = baseUrl.replace(/\/v1\/?$/, "");
  const q = (s: string) => JSON.stringify(s);
  return [
    {
      label: "curl",
      code: [
        `curl ${baseUrl}/chat/completions \\`,
        `  -H "Authorization: Bearer ${key}" \\`,
        `  -H "Content-Type: application/json" \\`,
        `  -d '{"model": ${q(model)}, "messages": [{"role": "user", "content": "Hello"}]}'`,
      ].join("\n"),
    },
    {
      label: "Python (openai)",
      code: [
        "from openai import OpenAI",
        "",
        `client = OpenAI(base_url=${q(baseUrl)}, api_key=${q(key)})`,
        `reply = client.chat.completions.create(model=${q(model)}, messages=[{"role": "user", "content": "Hello"}])`,
        "print(reply.choices[0].message.content)",
      ].join("\n"),
    },
    {
      // One round of a tool loop in the OpenAI wire shape: the model may call get_weather; each
      // call's arguments are JSON text, its result goes back as a "tool" message with its id.
      label: "Python (openai, tools)",
      code: [
        "import json",
        "from openai import OpenAI",
        "",
        `client = OpenAI(base_url=${q(baseUrl)}, api_key=${q(key)})`,
        "tools = [{",
        '    "type": "function",',
        '    "function": {',
        '        "name": "get_weather",',
        '        "description": "The current weather in a city",',
        '        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},',
        "    },",
        "}]",
        'messages = [{"role": "user", "content": "What is the weather in Paris?"}]',
        `reply = client.chat.completions.create(model=${q(model)}, messages=messages, tools=tools)`,
        "message = reply.choices[0].message",
        "if message.tool_calls:",
        '    messages.append({"role": "assistant", "content": message.content,',
        '                     "tool_calls": [call.model_dump() for call in message.tool_calls]})',
        "    for call in message.tool_calls:",
        "        args = json.loads(call.function.arguments)",
        '        print("call:", call.function.name, args)',
        '        result = {"city": args.get("city"), "temperature_c": 18}  # your function here',
        '        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})',
        `    reply = client.chat.completions.create(model=${q(model)}, messages=messages, tools=tools)`,
        "print(reply.choices[0].message.content)",
      ].join("\n"),
    },
    {
      label: "Python (anthropic)",
      code: [
        "import anthropic",
        "",
        `client = anthropic.Anthropic(base_url=${q(origin)}, api_key=${q(key)})`,
        `reply = client.messages.create(model=${q(model)}, max_tokens=512, messages=[{"role": "user", "content": "Hello"}])`,
        "print(reply.content[0].text)",
      ].join("\n"),
    },
  ];
}

export class KeysDialog {
  private dialog: HTMLDialogElement;
  private body: HTMLElement;
  private fresh: HTMLElement;
  private error: HTMLElement;

  constructor(private http: Http) {
    this.body = h("div", { class: "keys-list" });
    this.fresh = h("div", { class: "key-fresh" });
    this.error = h("div", { class: "form-error", attrs: { role: "alert" } });
    const name = h("input", { attrs: { name: "name", placeholder: "Key name, e.g. laptop", maxlength: "100", required: "" } });
    const form = h(
      "form",
      {
        class: "key-create",
        on: {
          submit: (e) => {
            e.preventDefault();
            void this.create(name.value.trim() || "key").then(() => (name.value = ""));
          },
        },
      },
      name,
      h("button", { class: "btn btn-primary", text: "Create key", attrs: { type: "submit" } }),
    );
    this.dialog = h(
      "dialog",
      { class: "keys-dialog", attrs: { "aria-label": "API keys" } },
      h(
        "header",
        { class: "dialog-head" },
        h("h2", { text: "API keys" }),
        h("button", { class: "icon-btn", text: "✕", attrs: { type: "button", "aria-label": "Close" }, on: { click: () => this.dialog.close() } }),
      ),
      h("p", {
        class: "hint",
        text: "Keys let other programs use the API as you, with the openai or anthropic SDK or curl (Authorization: Bearer <key> or x-api-key: <key>). A new key is shown only once, with snippets to paste.",
      }),
      form,
      this.error,
      this.fresh,
      this.body,
    );
    document.body.append(this.dialog);
  }

  async show(): Promise<void> {
    this.fresh.replaceChildren();
    this.error.textContent = "";
    this.dialog.showModal();
    await this.refresh();
  }

  private async refresh(): Promise<void> {
    let keys: ApiKey[];
    try {
      keys = await this.http.listKeys();
    } catch (e) {
      this.body.replaceChildren();
      this.error.textContent =
        e instanceof ApiError && e.status === 404 ? "API keys are not available on this server." : `Could not load keys: ${(e as Error).message}`;
      return;
    }
    if (!keys.length) {
      this.body.replaceChildren(h("p", { class: "hint", text: "No keys yet." }));
      return;
    }
    this.body.replaceChildren(
      h(
        "table",
        { class: "keys-table" },
        h("thead", {}, h("tr", {}, h("th", { text: "Name" }), h("th", { text: "Key" }), h("th", { text: "Created" }), h("th", { text: "Last used" }), h("th"))),
        h(
          "tbody",
          {},
          ...keys.map((k) =>
            h(
              "tr",
              {},
              h("td", { text: k.name }),
              h("td", { class: "mono", text: k.prefix ? `${k.prefix}…` : "—" }),
              h("td", { text: k.created ? new Date(k.created).toLocaleDateString() : "—" }),
              h("td", { text: k.last_used ? new Date(k.last_used).toLocaleString() : "never" }),
              h(
                "td",
                {},
                h("button", {
                  class: "link-btn danger",
                  text: "Revoke",
                  attrs: { type: "button" },
                  on: { click: () => void this.revoke(k) },
                }),
              ),
            ),
          ),
        ),
      ),
    );
  }

  private async create(name: string): Promise<void> {
    this.error.textContent = "";
    try {
      const k: CreatedKey = await this.http.createKey(name);
      const secret = k.key ?? "";
      const code = h("code", { class: "mono", text: secret });
      const baseUrl = k.base_url ?? `${window.location.origin}/v1`;
      const model = k.model ?? "colibri";
      this.fresh.replaceChildren(
        h("p", { text: `Copy “${k.name || name}” now — it will not be shown again:` }),
        h(
          "div",
          { class: "key-secret" },
          code,
          h("button", { class: "btn", text: "Copy", attrs: { type: "button" }, on: { click: () => void navigator.clipboard?.writeText(secret) } }),
        ),
        h("p", { class: "hint", text: `Base URL ${baseUrl} · model ${model}` }),
        ...snippets(secret, baseUrl, model).map(({ label, code: text }) =>
          h(
            "details",
            { class: "key-snippet", attrs: { "data-snippet": label } },
            h("summary", { text: label }),
            h("pre", { class: "mono" }, h("code", { text })),
            h("button", { class: "btn", text: "Copy", attrs: { type: "button" }, on: { click: () => void navigator.clipboard?.writeText(text) } }),
          ),
        ),
      );
    } catch (e) {
      this.error.textContent = `Could not create the key: ${(e as Error).message}`;
    }
    await this.refresh();
  }

  private async revoke(k: ApiKey): Promise<void> {
    if (!window.confirm(`Revoke “${k.name}”? Programs using it will stop working.`)) return;
    try {
      await this.http.revokeKey(k.id);
    } catch (e) {
      this.error.textContent = `Could not revoke the key: ${(e as Error).message}`;
    }
    await this.refresh();
  }
}
