// Model output -> safe HTML: marked (GFM) -> DOMPurify -> highlight.js on the sanitised DOM.
// Model text is untrusted (a prompt can make it emit anything), so nothing it writes may run:
// DOMPurify drops scripts, event handlers and javascript: URLs, and images become plain links so
// a reply cannot make the browser fetch an arbitrary URL (no tracking pixels, no data exfiltration).
import DOMPurify from "dompurify";
import { Marked } from "marked";
import hljs from "highlight.js/lib/core";
import bash from "highlight.js/lib/languages/bash";
import c from "highlight.js/lib/languages/c";
import cpp from "highlight.js/lib/languages/cpp";
import javascript from "highlight.js/lib/languages/javascript";
import json from "highlight.js/lib/languages/json";
import python from "highlight.js/lib/languages/python";
import sql from "highlight.js/lib/languages/sql";
import typescript from "highlight.js/lib/languages/typescript";
import xml from "highlight.js/lib/languages/xml";

hljs.registerLanguage("bash", bash);
hljs.registerLanguage("c", c);
hljs.registerLanguage("cpp", cpp);
hljs.registerLanguage("javascript", javascript);
hljs.registerLanguage("json", json);
hljs.registerLanguage("python", python);
hljs.registerLanguage("sql", sql);
hljs.registerLanguage("typescript", typescript);
hljs.registerLanguage("xml", xml);

const marked = new Marked({ gfm: true, breaks: true, async: false });

const purifier = DOMPurify(window);
purifier.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const PURIFY_CONFIG = {
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "iframe", "object", "embed", "svg", "math", "video", "audio", "source", "picture"],
  FORBID_ATTR: ["style", "srcset"],
  ALLOW_DATA_ATTR: false,
};

function imagesToLinks(html: string): string {
  // Runs before sanitising: each <img> becomes "[image: alt]" text; DOMPurify then removes the rest.
  const tpl = document.createElement("template");
  tpl.innerHTML = html; // a <template> is inert: nothing in it loads or runs
  for (const img of Array.from(tpl.content.querySelectorAll("img"))) {
    const alt = img.getAttribute("alt") || "image";
    img.replaceWith(document.createTextNode(`[${alt}]`));
  }
  return tpl.innerHTML;
}

export function renderMarkdown(text: string): DocumentFragment {
  const raw = marked.parse(text) as string;
  const frag = purifier.sanitize(imagesToLinks(raw), { ...PURIFY_CONFIG, RETURN_DOM_FRAGMENT: true });
  for (const block of Array.from(frag.querySelectorAll("pre code"))) {
    const el = block as HTMLElement;
    const lang = /language-([\w-]+)/.exec(el.className)?.[1];
    if (lang && !hljs.getLanguage(lang)) el.className = ""; // unknown language: leave it plain
    hljs.highlightElement(el);
  }
  return frag;
}
