"""Float64 numpy forwards written from each architecture's published definition (Hugging Face
transformers' modeling files), independent of the engine's code and of native/tools/llama_ref.py.
Weights come from the GGUF through gguf's own dequantizers. Used by test_arch_oracle.py.

Every architecture's heads have a key width HDK (attention.key_length: q, k, RoPE, the 1/sqrt(HDK)
score scale) and a value width HDV (attention.value_length, default HDK: v and each head's output,
so attn_output reads H * HDV values); transformers' modules have one head_dim, the HDK == HDV case.

qwen3moe (transformers Qwen3MoeForCausalLM): RMSNorm (x / sqrt(mean x^2 + eps) * w); attention
with per-head q_norm / k_norm RMSNorms before rotary embeddings; rotary "rotate_half" (NeoX)
with inv_freq = base^(-2i/head_dim); grouped-query causal softmax attention scaled by
1/sqrt(head_dim); sparse MoE block: router softmax over all experts, top-k, weights renormalized
when norm_topk_prob, experts SiLU(gate) * up -> down; untied lm_head.
olmoe (OlmoeForCausalLM): q_norm / k_norm are RMSNorms over the whole q / k projection; router
softmax, top-k, norm_topk_prob false.
qwen2moe (Qwen2MoeForCausalLM): q/k/v projections with bias; router softmax, top-k,
norm_topk_prob false; plus shared_expert(h) * sigmoid(shared_expert_gate(h)).
granitemoe (GraniteMoeForCausalLM): embeddings * embedding_multiplier; scores *
attention_multiplier; residual + branch * residual_multiplier; logits / logits_scaling;
GraniteMoeTopKGating: top-k of the router logits, softmax over those. (llama.cpp's converter
permutes q/k rows so that HF's rotate_half becomes interleaved pairs on the GGUF weights; this
reference applies the interleaved form to the GGUF weights, the same function.)
glm4moe (Glm4MoeForCausalLM): q/k/v with bias; rotary on the first partial_rotary_factor of
head_dim (rotate_half); first_k_dense_replace dense MLP blocks; Glm4MoeTopkRouter: sigmoid
scores, choice by scores + e_score_correction_bias within the topk_group best of n_group groups
(group score: sum of its top 2), weights = chosen scores, / sum when norm_topk_prob, *
routed_scaling_factor; plus the shared experts' MLP; the MTP (nextn) layers are not in the
causal LM forward.
gpt-oss (GptOssForCausalLM): see GptOss below (sinks, alternating sliding windows, YaRN as
llama.cpp rounds it, router bias with a softmax over the top k, clamped SwiGLU with biases).
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize


def gguf_field(r, key, default=None):
    """A GGUF key's value (a string or a number) from a GGUFReader, or `default`."""
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
        return gguf_field(self.r, k, default)


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


def rope_interleaved(x, pos, base, rdim):
    """Pairs (2i, 2i+1), angle pos * base^(-2i/rdim) (llama.cpp's normal RoPE)."""
    inv = base ** (-np.arange(rdim // 2) * 2.0 / rdim)
    ang = pos[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0:rdim:2], x[..., 1:rdim:2]
    out = x.copy()
    out[..., 0:rdim:2] = x0 * cos - x1 * sin
    out[..., 1:rdim:2] = x0 * sin + x1 * cos
    return out


class Ref:
    """The decoder skeleton every one of these models shares (embeddings, pre-norm attention and
    FFN blocks, final norm, head); each architecture below states its own pieces."""
    arch = ""
    neox = True
    ffn_norm = "ffn_norm"      # GGUF name of the FFN's pre-norm (HF post_attention_layernorm)

    def __init__(self, path):
        self.w = W = Weights(path)
        a = self.arch
        self.L = int(W.key(f"{a}.block_count")) - int(W.key(f"{a}.nextn_predict_layers", 0))
        self.D = int(W.key(f"{a}.embedding_length"))
        self.H = int(W.key(f"{a}.attention.head_count"))
        self.KVH = int(W.key(f"{a}.attention.head_count_kv"))
        self.HDK = int(W.key(f"{a}.attention.key_length", self.D // self.H))
        self.HDV = int(W.key(f"{a}.attention.value_length", self.HDK))
        self.RD = int(W.key(f"{a}.rope.dimension_count", self.HDK))
        self.eps = float(W.key(f"{a}.attention.layer_norm_rms_epsilon"))
        self.base = float(W.key(f"{a}.rope.freq_base"))
        self.top_k = int(W.key(f"{a}.expert_used_count"))

    def key(self, suffix, default=None):
        return self.w.key(f"{self.arch}.{suffix}", default)

    def proj(self, h, p, name):
        W = self.w
        y = h @ W(p + name + ".weight").T
        return y + W(p + name + ".bias") if W.has(p + name + ".bias") else y

    def qk(self, l, q, k):          # hook: q/k norms
        return q, k

    def rope(self, x, pos):
        return (rope_neox if self.neox else rope_interleaved)(x, pos, self.base, self.RD)

    def attn_scale(self):
        return 1.0 / np.sqrt(self.HDK)

    def mlp(self, h, p, kind=""):
        W = self.w
        return (silu(h @ W(p + f"ffn_gate{kind}.weight").T) * (h @ W(p + f"ffn_up{kind}.weight").T)) @ W(p + f"ffn_down{kind}.weight").T

    def expert(self, p, kind, e):
        """Expert e's matrix: a slice of the stacked ffn_{kind}_exps (gate and up: halves of
        ffn_gate_up_exps when fused), or (older llama files) its own tensor ffn_{kind}.{e}."""
        W = self.w
        if kind != "down" and W.has(p + "ffn_gate_up_exps.weight"):   # fused: gate rows, then up rows
            gu = W(p + "ffn_gate_up_exps.weight")[e]
            return gu[: len(gu) // 2] if kind == "gate" else gu[len(gu) // 2:]
        return W(p + f"ffn_{kind}_exps.weight")[e] if W.has(p + f"ffn_{kind}_exps.weight") else W(p + f"ffn_{kind}.{e}.weight")

    def experts(self, p, h_i, sel, wts):
        out = np.zeros(self.D)
        for e, wt in zip(sel, wts):
            g = h_i @ self.expert(p, "gate", e).T
            u = h_i @ self.expert(p, "up", e).T
            out += wt * ((silu(g) * u) @ self.expert(p, "down", e).T)
        return out

    def route(self, l, logits_i):   # -> (selected experts, weights)
        raise NotImplementedError

    def ffn(self, l, h):
        W, p = self.w, f"blk.{l}."
        if not W.has(p + "ffn_gate_inp.weight"):
            return self.mlp(h, p)
        logits = h @ W(p + "ffn_gate_inp.weight").T
        out = np.stack([self.experts(p, h[i], *self.route(l, logits[i])) for i in range(len(h))])
        return out + self.shared(l, h)

    def shared(self, l, h):
        return 0.0

    def embed(self, ids):
        return self.w("token_embd.weight")[np.asarray(ids)].copy()

    def residual(self, x, branch):
        return x + branch

    def head(self, x):
        W = self.w
        out = W("output.weight") if W.has("output.weight") else W("token_embd.weight")
        return rmsnorm(x, W("output_norm.weight"), self.eps) @ out.T

    def forward(self, ids):
        W = self.w
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        x = self.embed(ids)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = rmsnorm(x, W(p + "attn_norm.weight"), self.eps)
            q, k = self.qk(l, self.proj(h, p, "attn_q"), self.proj(h, p, "attn_k"))
            v = self.proj(h, p, "attn_v").reshape(n, self.KVH, self.HDV)
            q = self.rope(q.reshape(n, self.H, self.HDK), pos)
            k = self.rope(k.reshape(n, self.KVH, self.HDK), pos)
            rep = self.H // self.KVH
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) * self.attn_scale() + mask
            o = np.einsum("hqk,khd->qhd", softmax(s), v).reshape(n, self.H * self.HDV)
            x = self.residual(x, o @ W(p + "attn_output.weight").T)
            x = self.residual(x, self.ffn(l, rmsnorm(x, W(p + self.ffn_norm + ".weight"), self.eps)))
        return self.head(x)


def group_mask(choice, groups, used):
    """Grouped top-k (llama.cpp's build_moe_ffn, DeepSeek-V3): the experts of all but the `used`
    best of `groups` equal groups (a group's score: the sum of its two best choices) get -inf."""
    if groups <= 1 or used >= groups:
        return choice
    per = len(choice) // groups
    gs = np.array([np.sort(choice[g * per:(g + 1) * per])[-2:].sum() for g in range(groups)])
    mask = np.zeros(len(choice), bool)
    for g in np.argsort(-gs, kind="stable")[:used]:
        mask[g * per:(g + 1) * per] = True
    return np.where(mask, choice, -np.inf)


def softmax_topk(logits_i, k, norm, groups=(0, 0)):
    probs = softmax(logits_i)
    sel = np.argsort(-group_mask(probs, *groups), kind="stable")[:k]
    wts = probs[sel]
    return sel, (wts / wts.sum() if norm else wts)


class Llama(Ref):
    """Mixtral on llama.cpp's `llama` architecture (MixtralForCausalLM): rotary embeddings on the
    GGUF's interleaved pairs (the converter permutes q/k rows, see granitemoe); router softmax over
    all experts, top-k, renormalised (MixtralSparseMoeBlock)."""
    arch = "llama"
    neox = False

    def route(self, l, lg):
        return softmax_topk(lg, self.top_k, True)


class Qwen3Moe(Ref):
    arch = "qwen3moe"

    def qk(self, l, q, k):
        W, p, n = self.w, f"blk.{l}.", len(q)
        q = rmsnorm(q.reshape(n, self.H, self.HDK), W(p + "attn_q_norm.weight"), self.eps)
        k = rmsnorm(k.reshape(n, self.KVH, self.HDK), W(p + "attn_k_norm.weight"), self.eps)
        return q, k

    def route(self, l, lg):
        groups = int(self.key("expert_group_count", 0)), int(self.key("expert_group_used_count", 0))
        return softmax_topk(lg, self.top_k, bool(self.key("expert_weights_norm", True)), groups)


class Olmoe(Ref):
    arch = "olmoe"

    def qk(self, l, q, k):
        W, p = self.w, f"blk.{l}."
        return rmsnorm(q, W(p + "attn_q_norm.weight"), self.eps), rmsnorm(k, W(p + "attn_k_norm.weight"), self.eps)

    def route(self, l, lg):
        return softmax_topk(lg, self.top_k, bool(self.key("expert_weights_norm", False)))


class Qwen2Moe(Ref):
    arch = "qwen2moe"

    def route(self, l, lg):
        return softmax_topk(lg, self.top_k, bool(self.key("expert_weights_norm", False)))

    def shared(self, l, h):
        W, p = self.w, f"blk.{l}."
        gate = 1.0 / (1.0 + np.exp(-(h @ W(p + "ffn_gate_inp_shexp.weight"))))
        return self.mlp(h, p, "_shexp") * gate[:, None]


class GraniteMoe(Ref):
    arch = "granitemoe"
    neox = False

    def embed(self, ids):
        return super().embed(ids) * float(self.key("embedding_scale"))

    def attn_scale(self):
        return float(self.key("attention.scale"))

    def residual(self, x, branch):
        return x + branch * float(self.key("residual_scale"))

    def head(self, x):
        return super().head(x) / float(self.key("logit_scale"))

    def route(self, l, lg):
        sel = np.argsort(-lg, kind="stable")[: self.top_k]
        return sel, softmax(lg[sel])


class Glm4Moe(Ref):
    arch = "glm4moe"
    ffn_norm = "post_attention_norm"

    def route(self, l, lg):
        W = self.w
        scores = 1.0 / (1.0 + np.exp(-lg))
        choice = scores + W(f"blk.{l}.exp_probs_b.bias")
        choice = group_mask(choice, int(self.key("expert_group_count", 1)), int(self.key("expert_group_used_count", 1)))
        sel = np.argsort(-choice, kind="stable")[: self.top_k]
        wts = scores[sel]
        if bool(self.key("expert_weights_norm", True)):
            wts = wts / (wts.sum() + 1e-20)
        return sel, wts * float(self.key("expert_weights_scale", 1.0))

    def shared(self, l, h):
        return self.mlp(h, f"blk.{l}.", "_shexp")


def yarn_inv_freq(base, d, factor, orig, beta_fast=32.0, beta_slow=1.0):
    """(inv_freq [d/2], cos/sin factor) of YaRN as llama.cpp computes it (ggml_rope_yarn_corr_dims):
    transformers' _compute_yarn_parameters with the correction range rounded outwards (floor / ceil,
    clipped to [0, d - 1]; gpt-oss's HF config says truncate false, llama.cpp rounds: it runs the
    GGUF files, so it is the contract here); interpolation 1 / (factor base^(2i/d)) blended with
    extrapolation by 1 - ramp_i; cos/sin times 1 + 0.1 ln(factor)."""
    pos_freqs = base ** (np.arange(0, d, 2, dtype=np.float64) / d)

    def corr(rot):
        return d * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(base))

    low, high = max(np.floor(corr(beta_fast)), 0.0), min(np.ceil(corr(beta_slow)), d - 1.0)
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / max(high - low, 0.001), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, 1.0 + 0.1 * np.log(factor)


def swiglu_oai(g, u, alpha=1.702, limit=7.0):
    """gpt-oss's expert activation (HF GptOssExperts._apply_gate, ggml's swiglu_oai)."""
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


class GptOss(Ref):
    """gpt-oss (transformers GptOssForCausalLM; llama.cpp's openai-moe graph): q/k/v/o with bias;
    NeoX rotary with YaRN (yarn_inv_freq); each head's sink logit joins its softmax and is dropped
    (GptOssAttention: cat(scores, sink), softmax, drop the last column); layer_types alternate
    sliding_attention (even layers: a query at p sees keys p - W < k <= p) and full_attention;
    post_attention_layernorm before the MoE; GptOssTopKRouter: logits + bias, top-k, softmax over
    the k; GptOssExperts: gate/up with biases, swiglu_oai, down with bias, weighted sum."""
    arch = "gpt-oss"
    ffn_norm = "post_attention_norm"

    def __init__(self, path):
        super().__init__(path)
        self.window = int(self.key("attention.sliding_window"))
        self.inv, self.mscale = yarn_inv_freq(self.base, self.RD, float(self.key("rope.scaling.factor")),
                                              float(self.key("rope.scaling.original_context_length")))

    def swa(self, l):
        """llama.cpp's set_swa_pattern(n): l % n < n - 1, n = attention.sliding_window_pattern (2)."""
        n = int(self.key("attention.sliding_window_pattern", 2))
        return n == 0 or l % n < n - 1

    def rope(self, x, pos):
        d = self.RD
        ang = pos[:, None] * self.inv[None, :]
        cos, sin = (np.cos(ang) * self.mscale)[:, None, :], (np.sin(ang) * self.mscale)[:, None, :]
        out = x.copy()
        a, b = x[..., : d // 2], x[..., d // 2:d]
        out[..., : d // 2], out[..., d // 2:d] = a * cos - b * sin, b * cos + a * sin
        return out

    def attention(self, l, h, pos):
        W, p, n = self.w, f"blk.{l}.", len(h)
        q = self.rope(self.proj(h, p, "attn_q").reshape(n, self.H, self.HDK), pos)
        k = self.rope(self.proj(h, p, "attn_k").reshape(n, self.KVH, self.HDK), pos)
        v = self.proj(h, p, "attn_v").reshape(n, self.KVH, self.HDV)
        rep = self.H // self.KVH
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        qi, ki = np.arange(n)[:, None], np.arange(n)[None, :]
        visible = (ki <= qi) & ((qi - ki < self.window) if self.swa(l) else True)
        s = np.einsum("qhd,khd->hqk", q, k) * self.attn_scale() + np.where(visible, 0.0, -np.inf)
        sink = W(p + "attn_sinks.weight")[:, None, None] * np.ones((1, n, 1))
        full = np.concatenate([s, sink], axis=-1)
        probs = softmax(full)[..., :-1]
        o = np.einsum("hqk,khd->qhd", probs, v).reshape(n, self.H * self.HDV)
        return self.proj(o, p, "attn_output")

    def route(self, l, lg):
        sel = np.argsort(-lg, kind="stable")[: self.top_k]
        return sel, softmax(lg[sel])

    def experts(self, p, h_i, sel, wts):
        W = self.w
        out = np.zeros(self.D)
        for e, wt in zip(sel, wts):
            g = h_i @ self.expert(p, "gate", e).T + W(p + "ffn_gate_exps.bias")[e]
            u = h_i @ self.expert(p, "up", e).T + W(p + "ffn_up_exps.bias")[e]
            out += wt * (swiglu_oai(g, u) @ self.expert(p, "down", e).T + W(p + "ffn_down_exps.bias")[e])
        return out

    def ffn(self, l, h):
        W, p = self.w, f"blk.{l}."
        logits = h @ W(p + "ffn_gate_inp.weight").T + W(p + "ffn_gate_inp.bias")
        return np.stack([self.experts(p, h[i], *self.route(l, logits[i])) for i in range(len(h))])

    def forward(self, ids):
        W = self.w
        pos = np.arange(len(ids), dtype=np.float64)
        x = self.embed(ids)
        for l in range(self.L):
            p = f"blk.{l}."
            x = x + self.attention(l, rmsnorm(x, W(p + "attn_norm.weight"), self.eps), pos)
            x = x + self.ffn(l, rmsnorm(x, W(p + self.ffn_norm + ".weight"), self.eps))
        return self.head(x)


REFS = {"llama": Llama, "qwen3moe": Qwen3Moe, "olmoe": Olmoe, "qwen2moe": Qwen2Moe, "granitemoe": GraniteMoe, "glm4moe": Glm4Moe, "gpt-oss": GptOss}


def log_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def agreement(eng_lp, ref_lp, ids, start, top=32):
    """Teacher-forced scoring of ids from position start on: how many of the reference's greedy
    choices (ids[pos + 1]) the engine's log-probs also rank first, and the largest |d log-prob|
    over the reference's top `top` tokens at each position."""
    agree, err = 0, 0.0
    for pos in range(start, len(ids) - 1):
        agree += int(np.argmax(eng_lp[pos]) == ids[pos + 1])
        best = np.argsort(-ref_lp[pos])[:top]
        err = max(err, float(np.abs(ref_lp[pos, best] - eng_lp[pos, best]).max()))
    return agree, err


def greedy(ref, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(ref.forward(ids)[-1])))
    return ids
