"""A small numpy reference forward pass of llama-architecture GGUF models (dense or MoE).

It is the correctness oracle for the C engine (same formulas, float64 math, no quantized
activations) and the calibration forward of the default-model builder. Slow but exact enough.
"""
from __future__ import annotations

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType
from gguf.quants import dequantize


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if f.types and f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def tensor_f32(t) -> np.ndarray:
    """Dequantized tensor in numpy order (ne[n-1], ..., ne[0])."""
    shape = tuple(int(x) for x in reversed(t.shape[: len(t.shape)]))
    qt = GGMLQuantizationType(int(t.tensor_type))
    if qt in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        arr = np.asarray(t.data, dtype=np.float32)
    else:
        arr = dequantize(np.asarray(t.data), qt).astype(np.float32)
    return arr.reshape(shape)


class Model:
    """top_k: experts per token instead of the file's (the engine's TOPK; n_experts = every
    expert, which with unit gating is the dense FFN the file encodes). kv_f16: K (after RoPE)
    and V rounded to fp16 as they enter the cache, as an engine with an fp16 KV cache does."""

    def __init__(self, path, top_k: int | None = None, kv_f16: bool = False):
        r = GGUFReader(path)
        self.reader = r
        a = "llama"
        self.n_layers = int(_field(r, f"{a}.block_count"))
        self.d = int(_field(r, f"{a}.embedding_length"))
        self.n_heads = int(_field(r, f"{a}.attention.head_count"))
        self.n_kv = int(_field(r, f"{a}.attention.head_count_kv", self.n_heads))
        self.head_dim = self.d // self.n_heads
        self.rope_base = float(_field(r, f"{a}.rope.freq_base", 10000.0))
        self.eps = float(_field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5))
        self.n_experts = int(_field(r, f"{a}.expert_count", 0) or 0)
        self.top_k = int(_field(r, f"{a}.expert_used_count", 0) or 0)
        self.gating = _field(r, "colibri.expert_gating", "softmax")
        if top_k is not None:
            if not 1 <= top_k <= self.n_experts:
                raise ValueError(f"top_k {top_k} is invalid for {self.n_experts} experts")
            self.top_k = top_k
        self.kv_f16 = kv_f16
        self.t = {t.name: t for t in r.tensors}
        self._cache: dict[str, np.ndarray] = {}

    def w(self, name) -> np.ndarray:
        if name not in self._cache:
            self._cache[name] = tensor_f32(self.t[name]).astype(np.float64)
        return self._cache[name]

    def has(self, name) -> bool:
        return name in self.t

    def mm(self, x, name, e=None):
        """x @ W.T for tensor `name` (its slice e for stacked experts). The one place weights
        meet activations, so a subclass can model the engine's activation quantization."""
        w = self.w(name)
        return x @ (w if e is None else w[e]).T

    def mm_stack(self, x, name):
        """Every expert of stacked tensor `name` (E x rows x cols) at once: x is [n, cols] (the
        same input for all) or [n, E, cols] (one per expert); returns [n, E, rows]. Equal to
        mm(x, name, e) for each e (a subclass overriding mm alone gets that loop)."""
        if type(self).mm is not Model.mm:
            return np.stack([self.mm(x if x.ndim == 2 else x[:, e], name, e)
                             for e in range(self.w(name).shape[0])], axis=1)
        w = self.w(name)
        E, rows, cols = w.shape
        if x.ndim == 2:
            return (x @ w.reshape(E * rows, cols).T).reshape(len(x), E, rows)
        return np.matmul(x.transpose(1, 0, 2), w.transpose(0, 2, 1)).transpose(1, 0, 2)

    def rmsnorm(self, x, name):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w(name)

    def rope(self, x, pos):
        # Interleaved pairs (x[2i], x[2i+1]) per head, angle pos * base^(-2i/head_dim).
        hd = self.head_dim
        i = np.arange(hd // 2)
        theta = pos[:, None] * self.rope_base ** (-2.0 * i / hd)[None, :]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def ffn(self, L, h, record=None, routes=None):
        p = f"blk.{L}."
        if not self.has(p + "ffn_gate_inp.weight"):
            a = silu(self.mm(h, p + "ffn_gate.weight")) * self.mm(h, p + "ffn_up.weight")
            if record is not None:
                record(L, h, a)
            return self.mm(a, p + "ffn_down.weight")
        out = np.zeros_like(h)
        if self.has(p + "ffn_gate_shexp.weight"):
            a = silu(self.mm(h, p + "ffn_gate_shexp.weight")) * self.mm(h, p + "ffn_up_shexp.weight")
            out += self.mm(a, p + "ffn_down_shexp.weight")
        logits = self.mm(h, p + "ffn_gate_inp.weight")
        if self.has(p + "ffn_gate_inp.bias"):
            logits = logits + self.w(p + "ffn_gate_inp.bias")
        if self.top_k == self.n_experts:      # every expert: one batched product per matrix
            if self.gating == "unit":
                wts = np.ones_like(logits)
            else:
                z = np.exp(logits - logits.max(axis=1, keepdims=True))
                wts = z / z.sum(axis=1, keepdims=True)
            if routes is not None:
                routes.extend((L, row, list(range(self.n_experts))) for row in range(h.shape[0]))
            a = silu(self.mm_stack(h, p + "ffn_gate_exps.weight")) * self.mm_stack(h, p + "ffn_up_exps.weight")
            return out + np.einsum("ne,ned->nd", wts, self.mm_stack(a, p + "ffn_down_exps.weight"))
        for row in range(h.shape[0]):
            sel = np.argsort(-logits[row], kind="stable")[: self.top_k]
            if self.gating == "unit":
                wts = np.ones(len(sel))
            else:
                z = np.exp(logits[row, sel] - logits[row, sel].max())
                wts = z / z.sum()
            if routes is not None:
                routes.append((L, row, sorted(int(e) for e in sel)))
            hr = h[row:row + 1]
            for e, wt in zip(sel, wts):
                a = silu(self.mm(hr, p + "ffn_gate_exps.weight", e)) * self.mm(hr, p + "ffn_up_exps.weight", e)
                out[row] += wt * self.mm(a, p + "ffn_down_exps.weight", e)[0]
        return out

    def forward(self, tokens, record=None, routes=None, cache=None) -> np.ndarray:
        """Logits for every new position (causal), float64. `cache` (a dict, filled in place)
        keeps K/V between calls so decoding one token at a time costs one position."""
        tokens = np.asarray(tokens)
        n = len(tokens)
        cache = {} if cache is None else cache
        past = cache.get("n", 0)
        x = self.w("token_embd.weight")[tokens].copy()
        pos = np.arange(past, past + n, dtype=np.float64)
        group = self.n_heads // self.n_kv
        mask = np.triu(np.full((n, past + n), -np.inf), past + 1)
        for L in range(self.n_layers):
            p = f"blk.{L}."
            h = self.rmsnorm(x, p + "attn_norm.weight")
            q = self.mm(h, p + "attn_q.weight").reshape(n, self.n_heads, self.head_dim)
            k = self.mm(h, p + "attn_k.weight").reshape(n, self.n_kv, self.head_dim)
            v = self.mm(h, p + "attn_v.weight").reshape(n, self.n_kv, self.head_dim)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if self.kv_f16:
                k, v = f16(k), f16(v)
            if past:
                k = np.concatenate([cache["k"][L], k])
                v = np.concatenate([cache["v"][L], v])
            cache.setdefault("k", [None] * self.n_layers)[L] = k
            cache.setdefault("v", [None] * self.n_layers)[L] = v
            o = np.empty_like(q)
            for hh in range(self.n_heads):
                kv = hh // group
                s = q[:, hh] @ k[:, kv].T / np.sqrt(self.head_dim) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv]
            x = x + self.mm(o.reshape(n, -1), p + "attn_output.weight")
            h = self.rmsnorm(x, p + "ffn_norm.weight")
            x = x + self.ffn(L, h, record, routes)
        cache["n"] = past + n
        head = "output.weight" if self.has("output.weight") else "token_embd.weight"
        return self.mm(self.rmsnorm(x, "output_norm.weight"), head)

    def greedy(self, prompt_ids, steps, eos=None):
        """Greedy continuation ids and the logits each choice was made from."""
        cache: dict = {}
        logits = self.forward(prompt_ids, cache=cache)[-1]
        out, seen = [], []
        for _ in range(steps):
            nxt = int(np.argmax(logits))
            out.append(nxt)
            seen.append(logits)
            if nxt == eos:
                break
            logits = self.forward([nxt], cache=cache)[-1]
        return out, seen


def f16(x):
    """x as an engine with an fp16 KV cache stores it: its float32 value rounded to the nearest
    fp16 (ties to even), back in float64."""
    return np.asarray(x).astype(np.float32).astype(np.float16).astype(np.float64)


def silu(x):
    return x / (1.0 + np.exp(-x))
