#!/usr/bin/env python3
"""make_tiny_qwen35moe.py — a seeded random-weight file in llama.cpp's `qwen35moe` layout
(Qwen3.5 / Qwen3.6-35B-A3B's tensors and keys, scaled down), or with --arch qwen3next in its
sibling's (Qwen3-Next-80B-A3B; make_tiny_qwen3next.py is this with --arch qwen3next), F32 throughout.

    make_tiny_qwen35moe.py OUT.gguf [--arch qwen35moe|qwen3next] [--seed 0] [--no-mtp] [--interval N]
                           [--q8] [--fuse-gate-up] [--legacy-ssm-in] [--omit-key SUFFIX]
                           [--omit-tensor NAME] [--shape K=V,...]

Shape: d_model 128; 4 layers, full_attention_interval 3 (layer 2 gated full attention, 0, 1
and 3 Gated DeltaNet: the interval is the file's, not Qwen's 4); attention 4 query heads / 2 KV
heads of 32 (key_length = value_length), per-head q/k norms, attn_q heads x [q | gate]; DeltaNet:
conv kernel 4, 2 q/k heads and 4 v heads of 16; 8 experts of 64, top-2, shared expert 96 wide with
its sigmoid gate; untied head; the tiny byte-level BPE vocabulary of make_tiny_moe.py and a ChatML
template. One trailing MTP block (nextn_predict_layers 1: nextn.eh_proj / enorm / hnorm /
shared_head_norm and a full attention + MoE block) unless --no-mtp.

qwen35moe: RoPE on 16 of 32 dims, base 1e7, interleaved M-RoPE sections [3, 2, 2, 1] (the 8th pair
is the 4th section's: it does not turn for text); the DeltaNet's attn_qkv, attn_gate, ssm_beta and
ssm_alpha, v head h reading q/k head h mod 2 (its converter tiles them).

qwen3next: plain NeoX RoPE on 8 of the 32 dims (partial_rotary_factor 0.25, as Qwen3-Next's 64 of
256), no M-RoPE sections; the v heads grouped (v head h reads q/k head h // 2); the DeltaNet's input
projections as the current converter writes them (convert_hf_to_gguf's Qwen3NextModel): attn_qkv
[q of every q/k head | k ... | v of every v head] and attn_gate (z), and ssm_ba = HF's in_proj_ba
unchanged, per q/k head [beta of its 2 v heads | alpha of them]. --legacy-ssm-in: HF's in_proj_qkvz
unchanged as the older files' ssm_in, per q/k head [q | k | v of its v heads | z of them] (the same
values: the two files are one model).

--fuse-gate-up (qwen35moe): the routed experts' gate and up as one ffn_gate_up_exps [d_model,
2 x 64, 8] (llama.cpp's layout: each expert's gate rows, then its up rows). --interval N:
full_attention_interval N instead (0: the key left out, which the engine refuses). --q8: every
matrix Q8_0 (routers, norms, conv and vectors F32). --omit-key SUFFIX / --omit-tensor NAME: a file
without <arch>.SUFFIX / that tensor (refusal tests). --shape K=V,...: other integer sizes (timings
on the released models' layer widths). Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_fixture import QWEN3_TEMPLATE, add_tokenizer  # noqa: E402
from make_tiny_moe import build_vocab  # noqa: E402

SHAPE: dict[str, Any] = dict(d_model=128, layers=4, interval=3, n_heads=4, n_kv=2, head_dim=32, rope_dim=16, sections=[3, 2, 2, 1],
             rope_base=1e7, eps=1e-6, ctx=4096, d_conv=4, k_heads=2, v_heads=4, ssm_head=16, experts=8, top_k=2,
             d_expert=64, d_shexp=96)
ARCH_SHAPE: dict[str, dict[str, Any]] = {"qwen35moe": {}, "qwen3next": dict(rope_dim=8, sections=None)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--arch", choices=sorted(ARCH_SHAPE), default="qwen35moe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mtp", action="store_true", help="no trailing MTP block")
    ap.add_argument("--interval", type=int, default=SHAPE["interval"], help="full_attention_interval (0: no key)")
    ap.add_argument("--q8", action="store_true", help="matrices Q8_0")
    ap.add_argument("--fuse-gate-up", action="store_true",
                    help="qwen35moe: routed gate and up as one blk.N.ffn_gate_up_exps (the same values)")
    ap.add_argument("--legacy-ssm-in", action="store_true",
                    help="qwen3next: the DeltaNet input as one fused blk.N.ssm_in (older files) instead of attn_qkv + attn_gate")
    ap.add_argument("--omit-key", action="append", default=[], metavar="SUFFIX",
                    help="leave <arch>.SUFFIX out (e.g. ssm.group_count)")
    ap.add_argument("--omit-tensor", action="append", default=[], metavar="NAME", help="leave this tensor out")
    ap.add_argument("--shape", default="", metavar="K=V,...",
                    help="integer fields of SHAPE changed (e.g. d_model=2048,ssm_head=128 for timings)")
    a = ap.parse_args(argv)
    arch, nxt = a.arch, a.arch == "qwen3next"
    if (a.fuse_gate_up and nxt) or (a.legacy_ssm_in and not nxt):
        ap.error("--fuse-gate-up is qwen35moe's, --legacy-ssm-in qwen3next's")
    h = dict(SHAPE, **ARCH_SHAPE[arch], interval=a.interval)
    for kv in filter(None, a.shape.split(",")):
        k, _, v = kv.partition("=")
        if k not in SHAPE or not isinstance(SHAPE[k], int):
            ap.error(f"--shape {kv!r}: not an integer field of SHAPE")
        h[k] = int(v)
    rng = np.random.default_rng(a.seed)
    tokens, types, merges = build_vocab()
    V, D, E, X, SX = len(tokens), h["d_model"], h["experts"], h["d_expert"], h["d_shexp"]
    H, KVH, HD = h["n_heads"], h["n_kv"], h["head_dim"]
    S, HK, HV = h["ssm_head"], h["k_heads"], h["v_heads"]
    R = HV // HK
    CH = 2 * HK * S + HV * S
    nextn = 0 if a.no_mtp else 1

    def mat(*shape: int, scale: float = 1.0) -> np.ndarray:   # numpy (..., rows, cols), fan_in = cols
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(a.out, arch)

    def key(suffix: str, value: Any) -> None:
        if suffix in a.omit_key:
            return
        if isinstance(value, list):
            w.add_array(f"{arch}.{suffix}", value)
        elif isinstance(value, float):
            w.add_float32(f"{arch}.{suffix}", value)
        else:
            w.add_uint32(f"{arch}.{suffix}", value)

    w.add_name(f"tiny-{arch}-{'q8_0' if a.q8 else 'f32'}")
    key("block_count", h["layers"] + nextn)
    key("context_length", h["ctx"])
    key("embedding_length", D)
    key("attention.head_count", H)
    key("attention.head_count_kv", KVH)
    key("attention.key_length", HD)
    key("attention.value_length", HD)
    key("rope.dimension_count", h["rope_dim"])
    if h["sections"]:
        key("rope.dimension_sections", h["sections"])
    key("rope.freq_base", float(h["rope_base"]))
    key("attention.layer_norm_rms_epsilon", float(h["eps"]))
    key("expert_count", E)
    key("expert_used_count", h["top_k"])
    key("expert_feed_forward_length", X)
    key("expert_shared_feed_forward_length", SX)
    if h["interval"]:
        key("full_attention_interval", h["interval"])
    key("ssm.conv_kernel", h["d_conv"])
    key("ssm.state_size", S)
    key("ssm.group_count", HK)
    key("ssm.time_step_rank", HV)
    key("ssm.inner_size", HV * S)
    if nextn:
        key("nextn_predict_layers", nextn)
    add_tokenizer(w, tokens, types, merges, QWEN3_TEMPLATE)
    interval = h["interval"] or 4     # the layout llama.cpp assumes without the key

    def put(name: str, arr: np.ndarray) -> None:
        """Matrices (2-D and up, not the routers) Q8_0 under --q8; the rest F32."""
        if name in a.omit_tensor:
            return
        if a.q8 and arr.ndim >= 2 and "gate_inp" not in name and "conv1d" not in name:
            w.add_tensor(name, quantize(arr, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, arr)

    put("token_embd.weight", mat(V, D, scale=np.sqrt(D) * 0.5))
    put("output_norm.weight", norm_w(D))
    put("output.weight", mat(V, D, scale=2.0))

    def attention(p: str) -> None:
        put(p + "attn_q.weight", mat(2 * H * HD, D))
        put(p + "attn_k.weight", mat(KVH * HD, D))
        put(p + "attn_v.weight", mat(KVH * HD, D))
        put(p + "attn_output.weight", mat(D, H * HD))
        put(p + "attn_q_norm.weight", norm_w(HD))
        put(p + "attn_k_norm.weight", norm_w(HD))

    def moe(p: str) -> None:
        put(p + "ffn_gate_inp.weight", mat(E, D, scale=2.0))
        gate, up = mat(E, X, D), mat(E, X, D)
        if a.fuse_gate_up:      # the same values in one tensor: each expert's gate rows, then its up rows
            put(p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1))
        else:
            put(p + "ffn_gate_exps.weight", gate)
            put(p + "ffn_up_exps.weight", up)
        put(p + "ffn_down_exps.weight", mat(E, D, X))
        put(p + "ffn_gate_inp_shexp.weight", mat(D, scale=2.0))
        put(p + "ffn_gate_shexp.weight", mat(SX, D))
        put(p + "ffn_up_shexp.weight", mat(SX, D))
        put(p + "ffn_down_shexp.weight", mat(D, SX))

    def deltanet_in(p: str) -> None:
        if not nxt:
            put(p + "attn_qkv.weight", mat(CH, D))
            put(p + "attn_gate.weight", mat(HV * S, D))
            return
        # HF's in_proj_qkvz rows, per q/k head [q S | k S | v R*S | z R*S]
        qkvz = mat(HK, 2 * S + 2 * R * S, D)
        if a.legacy_ssm_in:
            put(p + "ssm_in.weight", qkvz.reshape(-1, D))
        else:       # the converter's split: [q of all heads | k ... | v ...] and z
            q, k, v, z = (qkvz[:, :S], qkvz[:, S:2 * S], qkvz[:, 2 * S:2 * S + R * S], qkvz[:, 2 * S + R * S:])
            put(p + "attn_qkv.weight", np.concatenate([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]))
            put(p + "attn_gate.weight", np.ascontiguousarray(z.reshape(-1, D)))

    def deltanet(p: str) -> None:
        deltanet_in(p)
        put(p + "ssm_conv1d.weight", mat(CH, h["d_conv"], scale=1.5))
        put(p + "ssm_dt.bias", rng.uniform(-1.0, 1.0, HV).astype(np.float32))
        # ssm_a = -exp(A_log), A_log ~ U(0, log 16) as Qwen3-Next's initialisation
        put(p + "ssm_a", (-np.exp(rng.uniform(0.0, np.log(16.0), HV))).astype(np.float32))
        if nxt:     # in_proj_ba, per q/k head [b R | a R]
            put(p + "ssm_ba.weight", mat(2 * HV, D, scale=2.0))
        else:
            put(p + "ssm_beta.weight", mat(HV, D, scale=2.0))
            put(p + "ssm_alpha.weight", mat(HV, D, scale=2.0))
        put(p + "ssm_norm.weight", norm_w(S))
        put(p + "ssm_out.weight", mat(D, HV * S))

    for l in range(h["layers"] + nextn):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", norm_w(D))
        put(p + "post_attention_norm.weight", norm_w(D))
        if l < h["layers"] and (l + 1) % interval != 0:
            deltanet(p)
        else:
            attention(p)
        moe(p)
        if l >= h["layers"]:
            put(p + "nextn.eh_proj.weight", mat(D, 2 * D))
            put(p + "nextn.enorm.weight", norm_w(D))
            put(p + "nextn.hnorm.weight", norm_w(D))
            put(p + "nextn.shared_head_norm.weight", norm_w(D))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
