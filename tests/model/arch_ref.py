"""Float64 numpy forwards written from each architecture's published definition (Hugging Face
transformers' modeling files), independent of the engine's code and of native/tools/llama_ref.py.
Weights come from the GGUF through gguf's own dequantizers. Used by test_arch_oracle.py.

qwen3moe (transformers Qwen3MoeForCausalLM): RMSNorm (x / sqrt(mean x^2 + eps) * w); attention
with per-head q_norm / k_norm RMSNorms before rotary embeddings; rotary "rotate_half" (NeoX)
with inv_freq = base^(-2i/head_dim); grouped-query causal softmax attention scaled by
1/sqrt(head_dim); sparse MoE block: router softmax over all experts, top-k, weights renormalized
when norm_topk_prob, experts SiLU(gate) * up -> down; untied lm_head.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


def _field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    if f.types and f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


class Weights:
    def __init__(self, path):
        self.r = GGUFReader(path)
        self.t = {t.name: t for t in self.r.tensors}
        self.cache = {}

    def __call__(self, name):
        if name not in self.cache:
            t = self.t[name]
            qt = GGMLQuantizationType(int(t.tensor_type))
            data = np.asarray(t.data)
            if qt not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
                data = dequantize(data, qt)
            self.cache[name] = data.astype(np.float64).reshape(tuple(int(x) for x in reversed(t.shape)))
        return self.cache[name]

    def has(self, name):
        return name in self.t

    def key(self, k, default=None):
        return _field(self.r, k, default)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def rope_neox(x, pos, base, rdim):
    """x [n, heads, hd]: transformers' apply_rotary_pos_emb (rotate_half) on the first rdim dims."""
    half = rdim // 2
    inv = base ** (-np.arange(half) * 2.0 / rdim)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:rdim]
    out = x.copy()
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rdim] = x2 * cos + x1 * sin
    return out


class Qwen3Moe:
    def __init__(self, path):
        self.w = W = Weights(path)
        a = "qwen3moe"
        self.L = int(W.key(f"{a}.block_count"))
        self.H = int(W.key(f"{a}.attention.head_count"))
        self.KVH = int(W.key(f"{a}.attention.head_count_kv"))
        self.HD = int(W.key(f"{a}.attention.key_length"))
        self.eps = float(W.key(f"{a}.attention.layer_norm_rms_epsilon"))
        self.base = float(W.key(f"{a}.rope.freq_base"))
        self.top_k = int(W.key(f"{a}.expert_used_count"))
        self.norm_topk = bool(W.key(f"{a}.expert_weights_norm", True))

    def moe(self, l, h):
        W, p = self.w, f"blk.{l}."
        probs = softmax(h @ W(p + "ffn_gate_inp.weight").T)
        out = np.zeros_like(h)
        for i in range(len(h)):
            sel = np.argsort(-probs[i], kind="stable")[: self.top_k]
            wts = probs[i, sel]
            if self.norm_topk:
                wts = wts / wts.sum()
            for e, wt in zip(sel, wts):
                g = h[i] @ W(p + "ffn_gate_exps.weight")[e].T
                u = h[i] @ W(p + "ffn_up_exps.weight")[e].T
                out[i] += wt * ((silu(g) * u) @ W(p + "ffn_down_exps.weight")[e].T)
        return out

    def forward(self, ids):
        W = self.w
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        x = W("token_embd.weight")[np.asarray(ids)].copy()
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = rmsnorm(x, W(p + "attn_norm.weight"), self.eps)
            q = (h @ W(p + "attn_q.weight").T).reshape(n, self.H, self.HD)
            k = (h @ W(p + "attn_k.weight").T).reshape(n, self.KVH, self.HD)
            v = (h @ W(p + "attn_v.weight").T).reshape(n, self.KVH, self.HD)
            q = rope_neox(rmsnorm(q, W(p + "attn_q_norm.weight"), self.eps), pos, self.base, self.HD)
            k = rope_neox(rmsnorm(k, W(p + "attn_k_norm.weight"), self.eps), pos, self.base, self.HD)
            rep = self.H // self.KVH
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(self.HD) + mask
            o = np.einsum("hqk,khd->qhd", softmax(s), v).reshape(n, self.H * self.HD)
            x = x + o @ W(p + "attn_output.weight").T
            h = rmsnorm(x, W(p + "ffn_norm.weight"), self.eps)
            x = x + self.moe(l, h)
        return rmsnorm(x, W("output_norm.weight"), self.eps) @ W("output.weight").T


REFS = {"qwen3moe": Qwen3Moe}


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def greedy(ref, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(ref.forward(ids)[-1])))
    return ids
