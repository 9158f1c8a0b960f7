"""A float64 numpy forward of `qwen35moe` (Qwen3.5 / Qwen3.6 MoE) and of its sibling `qwen3next`
(Qwen3-Next, the Qwen3Next subclass at the end), written from the published
definition (transformers' Qwen3-Next / Qwen3.5 modeling: Qwen3NextGatedDeltaNet's recurrent form,
the gated attention, the sparse MoE block with its gated shared expert), on the GGUF's weights and
layout (llama.cpp's converter: attn_qkv = [q | k | v] channels, attn_q = per head [q | gate],
ssm_a = -exp(A_log), ssm_conv1d [channels, kernel]; v head h reads q/k head h mod the q/k heads).
Independent of the engine's code. Used by test_qwen35moe.py and test_qwen3next.py.

Layer l is linear attention unless (l + 1) % full_attention_interval == 0, or as
attention.recurrent_layers says. Per layer: x += mixer(rmsnorm(x)); x += moe(rmsnorm(x, post_attention_norm)).
  Gated DeltaNet: [q|k|v] = causal depthwise conv (kernel K, the state: the K - 1 previous inputs)
  of attn_qkv h, then SiLU; q, k L2-normalized per head (x / sqrt(sum x^2 + eps)); beta =
  sigmoid(ssm_beta h); g = softplus(ssm_alpha h + dt_bias) * ssm_a; per v head with state
  S [dk, dv]: S *= exp(g); S += k (beta (v - k S)); o = (q / sqrt(dk)) S; then
  rmsnorm(o, ssm_norm) * silu(attn_gate h) per head, ssm_out.
  Gated attention: q, gate from attn_q; per-head RMSNorm of q and k; rotary (rotate_half) on the
  first rope.dimension_count dims, with Qwen3-VL's interleaved M-RoPE for text positions: pair i
  in sector i mod sum(sections) turns with the position when sector % 3 = j and sector < 3 *
  sections[j] (j = 0, 1, 2), else not at all (the 4th position is 0 for text); causal GQA
  softmax / sqrt(head_dim); times sigmoid(gate); attn_output.
  MoE: softmax over all experts, top-k, renormalized; + shared expert * sigmoid(h . ffn_gate_inp_shexp).
The MTP block (the trailing nextn_predict_layers) is not part of the causal LM forward.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tests.model.arch_ref import Weights, rmsnorm, silu, softmax, softmax_topk


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.log1p(np.exp(x))


class Qwen35Moe:
    arch = "qwen35moe"

    def __init__(self, path: str) -> None:
        self.w = W = Weights(path)

        def key(s: str, default: Any = None) -> Any:
            return W.key(f"{self.arch}.{s}", default)

        self.L = int(key("block_count")) - int(key("nextn_predict_layers", 0))
        self.D = int(key("embedding_length"))
        self.H = int(key("attention.head_count"))
        self.KVH = int(key("attention.head_count_kv"))
        self.HD = int(key("attention.key_length"))
        self.RD = int(key("rope.dimension_count"))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.base = float(key("rope.freq_base"))
        self.top_k = int(key("expert_used_count"))
        self.K = int(key("ssm.conv_kernel"))
        self.S = int(key("ssm.state_size"))
        self.HK = int(key("ssm.group_count"))
        self.HV = int(key("ssm.time_step_rank"))
        self.sections = self.rope_sections()
        interval = int(key("full_attention_interval"))
        self.recurrent = [(l + 1) % interval != 0 for l in range(self.L)]

    def rope_sections(self) -> list[int] | None:
        f = self.w.r.fields[f"{self.arch}.rope.dimension_sections"]
        return [int(f.parts[i][0]) for i in f.data]

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        half, sec = self.RD // 2, self.sections
        if sec is None:     # plain NeoX: every pair turns
            turns = np.ones(half)
        else:
            total = sum(sec)
            turns = np.array([(i % total) < 3 * sec[(i % total) % 3] for i in range(half)], dtype=np.float64)
        inv = self.base ** (-np.arange(half) * 2.0 / self.RD) * turns
        ang = pos[:, None] * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:self.RD]
        out = x.copy()
        out[..., :half] = x1 * cos - x2 * sin
        out[..., half:self.RD] = x2 * cos + x1 * sin
        return out

    def attention(self, l: int, h: np.ndarray, pos: np.ndarray, cache: dict) -> np.ndarray:
        W, p, n, H, HD = self.w, f"blk.{l}.", len(h), self.H, self.HD
        qg = (h @ W(p + "attn_q.weight").T).reshape(n, H, 2 * HD)
        q, gate = qg[..., :HD], qg[..., HD:].reshape(n, H * HD)
        k = (h @ W(p + "attn_k.weight").T).reshape(n, self.KVH, HD)
        v = (h @ W(p + "attn_v.weight").T).reshape(n, self.KVH, HD)
        q = self.rope(rmsnorm(q, W(p + "attn_q_norm.weight"), self.eps), pos)
        k = self.rope(rmsnorm(k, W(p + "attn_k_norm.weight"), self.eps), pos)
        ks, vs = cache.get(l, (np.zeros((0, self.KVH, HD)), np.zeros((0, self.KVH, HD))))
        ks, vs = np.concatenate([ks, k]), np.concatenate([vs, v])
        cache[l] = (ks, vs)
        rep = H // self.KVH
        kk, vv = np.repeat(ks, rep, axis=1), np.repeat(vs, rep, axis=1)
        t0 = len(ks) - n
        mask = np.array([[0.0 if j <= t0 + i else -np.inf for j in range(len(ks))] for i in range(n)])
        s = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(HD) + mask
        o = np.einsum("hqk,khd->qhd", softmax(s), vv).reshape(n, H * HD)
        return (o * sigmoid(gate)) @ W(p + "attn_output.weight").T

    def projections(self, p: str, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The DeltaNet's inputs: the conv's [q | k | v] channels [n, channels], z [n, HV, S], and the
        raw beta and alpha [n, HV]."""
        W = self.w
        mixed = h @ W(p + "attn_qkv.weight").T
        z = (h @ W(p + "attn_gate.weight").T).reshape(len(h), self.HV, self.S)
        return mixed, z, h @ W(p + "ssm_beta.weight").T, h @ W(p + "ssm_alpha.weight").T

    def k_head(self, hv: int) -> int:
        """The q/k head v head hv reads (the converter tiles Qwen3.5's v heads: hv mod HK)."""
        return hv % self.HK

    def deltanet(self, l: int, h: np.ndarray, state: dict) -> np.ndarray:
        W, p, n, S, HK, HV, K = self.w, f"blk.{l}.", len(h), self.S, self.HK, self.HV, self.K
        mixed, z, b_raw, a_raw = self.projections(p, h)     # mixed: [n, channels]
        beta = sigmoid(b_raw)
        g = softplus(a_raw + W(p + "ssm_dt.bias")) * W(p + "ssm_a")
        conv_w = W(p + "ssm_conv1d.weight")                    # [channels, K]
        ch = mixed.shape[1]
        prev, M = state.get(l, (np.zeros((K - 1, ch)), np.zeros((HV, S, S))))
        seq = np.concatenate([prev, mixed])
        conv = np.stack([(seq[t:t + K] * conv_w.T).sum(axis=0) for t in range(n)])
        conv = silu(conv)
        kd = HK * S
        q = conv[:, :kd].reshape(n, HK, S)
        k = conv[:, kd:2 * kd].reshape(n, HK, S)
        v = conv[:, 2 * kd:].reshape(n, HV, S)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + self.eps)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + self.eps)
        M = M.copy()
        o = np.zeros((n, HV, S))
        for t in range(n):
            for hv in range(HV):
                qh, kh = q[t, self.k_head(hv)] / np.sqrt(S), k[t, self.k_head(hv)]
                M[hv] *= np.exp(g[t, hv])
                delta = (v[t, hv] - kh @ M[hv]) * beta[t, hv]
                M[hv] += np.outer(kh, delta)
                o[t, hv] = qh @ M[hv]
        state[l] = (seq[-(K - 1):], M)
        o = rmsnorm(o, W(p + "ssm_norm.weight"), self.eps) * silu(z)
        return o.reshape(n, HV * S) @ W(p + "ssm_out.weight").T

    def moe(self, l: int, h: np.ndarray) -> np.ndarray:
        W, p = self.w, f"blk.{l}."
        logits = h @ W(p + "ffn_gate_inp.weight").T
        out = np.zeros_like(h)
        for i in range(len(h)):
            sel, wts = softmax_topk(logits[i], self.top_k, True)
            for e, wt in zip(sel, wts):
                if W.has(p + "ffn_gate_up_exps.weight"):   # fused: each expert's gate rows, then its up rows
                    gu = W(p + "ffn_gate_up_exps.weight")[e]
                    gw, uw = gu[: len(gu) // 2], gu[len(gu) // 2:]
                else:
                    gw, uw = W(p + "ffn_gate_exps.weight")[e], W(p + "ffn_up_exps.weight")[e]
                gt, up = h[i] @ gw.T, h[i] @ uw.T
                out[i] += wt * ((silu(gt) * up) @ W(p + "ffn_down_exps.weight")[e].T)
        sh = (silu(h @ W(p + "ffn_gate_shexp.weight").T) * (h @ W(p + "ffn_up_shexp.weight").T)) @ W(
            p + "ffn_down_shexp.weight").T
        return out + sh * sigmoid(h @ W(p + "ffn_gate_inp_shexp.weight"))[:, None]

    def forward(self, ids: list[int], state: dict | None = None, start: int = 0) -> np.ndarray:
        """Logits of ids at positions start.., continuing `state` (the attention layers' K/V and the
        recurrent layers' conv inputs and S, updated in place) when given."""
        return self.forward_h(ids, state, start)[0]

    def mtp(self, h: np.ndarray, toks: list[int], start: int, cache: dict) -> tuple[np.ndarray, np.ndarray]:
        """llama.cpp's MTP graph (graph_mtp) over rows at positions start..: each reads its input
        state h (the trunk's output_norm'ed hidden state, or the block's own) and the token after
        its position; the block's K/V go to `cache`. -> (logits, the block's shared_head_norm'ed
        state)."""
        W, l, eps = self.w, self.L, self.eps
        p = f"blk.{l}."
        e = W("token_embd.weight")[np.asarray(toks)]
        x = np.concatenate([rmsnorm(e, W(p + "nextn.enorm.weight"), eps), rmsnorm(h, W(p + "nextn.hnorm.weight"), eps)],
                           axis=1) @ W(p + "nextn.eh_proj.weight").T
        pos = np.arange(start, start + len(toks), dtype=np.float64)
        x = x + self.attention(l, rmsnorm(x, W(p + "attn_norm.weight"), eps), pos, cache)
        x = x + self.moe(l, rmsnorm(x, W(p + "post_attention_norm.weight"), eps))
        hn = rmsnorm(x, W(p + "nextn.shared_head_norm.weight"), eps)
        return hn @ W("output.weight").T, hn

    def forward_h(self, ids: list[int], state: dict | None = None, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """forward's logits and the output_norm'ed states they are the head of (the MTP block's input)."""
        W = self.w
        state = {} if state is None else state
        kv, rec = state.setdefault("kv", {}), state.setdefault("rec", {})
        pos = np.arange(start, start + len(ids), dtype=np.float64)
        x = W("token_embd.weight")[np.asarray(ids)].copy()
        for l in range(self.L):
            p = f"blk.{l}."
            h = rmsnorm(x, W(p + "attn_norm.weight"), self.eps)
            x = x + (self.deltanet(l, h, rec) if self.recurrent[l] else self.attention(l, h, pos, kv))
            x = x + self.moe(l, rmsnorm(x, W(p + "post_attention_norm.weight"), self.eps))
        hn = rmsnorm(x, W("output_norm.weight"), self.eps)
        return hn @ W("output.weight").T, hn


class Qwen3Next(Qwen35Moe):
    """`qwen3next` (Qwen3-Next-80B-A3B), from transformers' Qwen3NextGatedDeltaNet / attention on
    llama.cpp's layout. Where it differs from qwen35moe: RoPE is plain rotate_half on the first
    rope.dimension_count dims (partial_rotary_factor; no M-RoPE sections); the v heads are grouped:
    HF's repeat_interleave gives v head hv q/k head hv // (HV / HK); the DeltaNet's projections are
    HF's fix_query_key_value_ordering on in_proj_qkvz (per q/k head [q | k | v | z], the v and z of
    its HV / HK v heads) and in_proj_ba (per q/k head [b | a]): in_proj_qkvz is the legacy ssm_in
    as it is, or the converter's attn_qkv ([all q | all k | all v]) + attn_gate (z); in_proj_ba is
    ssm_ba."""
    arch = "qwen3next"

    def rope_sections(self) -> list[int] | None:
        return None

    def k_head(self, hv: int) -> int:
        return hv // (self.HV // self.HK)

    def projections(self, p: str, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        W, n, S, HK, HV = self.w, len(h), self.S, self.HK, self.HV
        r = HV // HK
        ba = (h @ W(p + "ssm_ba.weight").T).reshape(n, HK, 2 * r)
        b, a = ba[..., :r].reshape(n, HV), ba[..., r:].reshape(n, HV)
        if not W.has(p + "ssm_in.weight"):
            return h @ W(p + "attn_qkv.weight").T, (h @ W(p + "attn_gate.weight").T).reshape(n, HV, S), b, a
        qkvz = (h @ W(p + "ssm_in.weight").T).reshape(n, HK, 2 * S + 2 * r * S)
        q, k = qkvz[..., :S], qkvz[..., S:2 * S]
        v, z = qkvz[..., 2 * S:2 * S + r * S], qkvz[..., 2 * S + r * S:]
        mixed = np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], axis=1)
        return mixed, z.reshape(n, HV, S), b, a
