// EMAP / HITS decoding (mux-protocol §4.4-4.5) and colibri's colours (peers.md §3.2).

export const TIER_NAMES = ["disk", "RAM", "VRAM"];
export const TIER_RGB: [number, number, number][] = [[0x3a, 0x47, 0x50], [0x5a, 0x9b, 0xd8], [0x4e, 0xd6, 0xa5]];

export function hexBytes(hex: string, n: number): Uint8Array {
  const out = new Uint8Array(n);
  const m = Math.min(n, hex.length >> 1);
  for (let i = 0; i < m; i++) out[i] = parseInt(hex.substr(i * 2, 2), 16);
  return out;
}

export const tierOf = (b: number) => Math.min(b >> 6, 2);
export const heatOf = (b: number) => b & 63;
// 0.35 + 0.65 * min(heat / 24, 1), as colibri's grid.
export const brightness = (heat: number) => 0.35 + 0.65 * Math.min(heat / 24, 1);

// Cell indices set in a HITS bitmap: bit i of byte i>>3, LSB first.
export function hitCells(hex: string, cells: number): number[] {
  const bytes = hexBytes(hex, Math.ceil(cells / 8));
  const out: number[] = [];
  for (let i = 0; i < cells; i++) if (bytes[i >> 3] & (1 << (i & 7))) out.push(i);
  return out;
}

export function heatText(heat: number): string {
  return heat === 0 ? "never routed" : `≈ 2^${heat} selections (${2 ** (heat - 1)}–${2 ** heat - 1})`;
}
