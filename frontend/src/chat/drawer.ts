// The sidebar as a drawer on narrow screens (issue 26 item 4). Below NARROW the sidebar leaves the
// grid and the header's menu button slides it in over the chat; while it is open the chat is
// `inert` (focus stays in the drawer, screen readers see only it), Escape, the scrim, the close
// button or any choice made in it close it, and focus goes back to the menu button. Above NARROW
// it is the plain sidebar column and this class does nothing.
// Invariant: the chat is inert only while the drawer is open on a narrow screen.
import { byId } from "./dom";

// Keep in step with the @media (max-width: 760px) rules of styles/app.css.
const NARROW = "(max-width: 760px)";

export class Drawer {
  private narrow = window.matchMedia(NARROW);
  private open = false;

  constructor(
    private panel: HTMLElement,
    private toggle: HTMLButtonElement,
    private scrim: HTMLElement,
    private rest: HTMLElement,
  ) {
    toggle.addEventListener("click", () => (this.open ? this.close() : this.show()));
    scrim.addEventListener("click", () => this.close());
    byId("menu-close").addEventListener("click", () => this.close());
    document.addEventListener("keydown", (e) => {
      if (!this.open || e.defaultPrevented) return;
      if (e.key === "Escape") {
        e.preventDefault();
        this.close();
      } else if (e.key === "Tab") this.wrapFocus(e);
    });
    // A rotation or a resize past the breakpoint: the sidebar is a column again, never left inert.
    this.narrow.addEventListener("change", () => this.close(false));
    this.sync();
  }

  show(): void {
    if (!this.narrow.matches) return;
    this.open = true;
    this.sync();
    const first = this.panel.querySelector<HTMLElement>(".new-chat");
    first?.focus();
  }

  // `refocus` false when the choice made in the drawer moves focus itself (a chat, a new chat).
  close(refocus = true): void {
    if (!this.open) return;
    this.open = false;
    this.sync();
    if (refocus && this.narrow.matches) this.toggle.focus();
  }

  // Tab past the last control comes back to the first (and Shift+Tab the other way): the rest of
  // the page is inert, and the browser would otherwise carry focus out to its own chrome.
  private wrapFocus(e: KeyboardEvent): void {
    const items = [...this.panel.querySelectorAll<HTMLElement>("button, a[href], input, [tabindex]")].filter(
      (el) => !el.hidden && el.tabIndex >= 0 && el.getClientRects().length > 0,
    );
    if (!items.length) return;
    const first = items[0], last = items[items.length - 1];
    const inside = this.panel.contains(document.activeElement);
    if (e.shiftKey && (!inside || document.activeElement === first)) {
      e.preventDefault();
      last.focus();
    } else if (!e.shiftKey && (!inside || document.activeElement === last)) {
      e.preventDefault();
      first.focus();
    }
  }

  private sync(): void {
    this.panel.classList.toggle("drawer-open", this.open);
    this.toggle.setAttribute("aria-expanded", String(this.open));
    this.scrim.hidden = !this.open;
    this.rest.inert = this.open;
    document.body.classList.toggle("drawer-locked", this.open);
  }
}

// The visual viewport's height as --app-height, so the layout (and the composer at its foot) ends
// where the on-screen keyboard begins even where `interactive-widget=resizes-content` is not
// honoured and the keyboard only shrinks the visual viewport (Safari). A pinch zoom also shrinks
// it, at a scale other than 1: ignored.
export function trackViewport(): void {
  const vv = window.visualViewport;
  if (!vv) return;
  const root = document.documentElement;
  const apply = () => {
    if (Math.abs(vv.scale - 1) > 0.01) return; // a pinch zoom, not a keyboard: keep the layout
    root.style.setProperty("--app-height", `${Math.round(vv.height)}px`);
  };
  vv.addEventListener("resize", apply);
  apply();
}
