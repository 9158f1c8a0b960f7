#!/usr/bin/env python3
"""make_tiny_qwen35moe.py — a seeded random-weight file in llama.cpp's `qwen35moe` layout
(Qwen3.5 / Qwen3.6-35B-A3B's tensors and keys, scaled down), F32 throughout.

    make_tiny_qwen35moe.py OUT.gguf [--seed 0] [--no-mtp] [--interval N] [--q8]

Shape: d_model 128; 4 layers, full_attention_interval 3 (layer 2 gated full attention, 0, 1
and 3 Gated DeltaNet: the interval is the file's, not Qwen's 4); attention 4 query heads / 2 KV
heads of 32 (key_length = value_length), per-head q/k norms, attn_q heads x [q | gate]; RoPE on
16 of 32 dims, base 1e7, interleaved M-RoPE sections [3, 2, 2, 1] (the 8th pair is the 4th
section's: it does not turn for text); DeltaNet: conv kernel 4, 2 q/k heads and 4 v heads of 16
(v head h reads q/k head h mod 2); 8 experts of 64, top-2, shared expert 96 wide with its sigmoid
gate; untied head; the tiny byte-level BPE vocabulary of make_tiny_moe.py and a ChatML template.
One trailing MTP block (nextn_predict_layers 1: nextn.eh_proj / enorm / hnorm and a full
attention + MoE block) unless --no-mtp. --fuse-gate-up: the routed experts' gate and up as one
ffn_gate_up_exps [d_model, 2 x 64, 8] (llama.cpp's layout: each expert's gate rows, then its up rows). --interval N: full_attention_interval N instead (0: the key
left out, which the engine refuses). --q8: every matrix Q8_0 (router, norms, conv and vectors F32).
--shape K=V,...: other integer sizes (timings on Qwen3.6-35B-A3B's layer widths).
Same arguments -> same bytes.
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

ARCH = "qwen35moe"
SHAPE: dict[str, Any] = dict(d_model=128, layers=4, interval=3, n_heads=4, n_kv=2, head_dim=32, rope_dim=16, sections=[3, 2, 2, 1],
             rope_base=1e7, eps=1e-6, ctx=4096, d_conv=4, k_heads=2, v_heads=4, ssm_head=16, experts=8, top_k=2,
             d_expert=64, d_shexp=96)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mtp", action="store_true", help="no trailing MTP block")
    ap.add_argument("--interval", type=int, default=SHAPE["interval"], help="full_attention_interval (0: no key)")
    ap.add_argument("--q8", action="store_true", help="matrices Q8_0")
    ap.add_argument("--fuse-gate-up", action="store_true",
                    help="routed gate and up as one blk.N.ffn_gate_up_exps (the same values)")
    ap.add_argument("--shape", default="", metavar="K=V,...",
                    help="integer fields of SHAPE changed (e.g. d_model=2048,ssm_head=128 for timings)")
    a = ap.parse_args(argv)
    h = dict(SHAPE, interval=a.interval)
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
    CH = 2 * HK * S + HV * S
    nextn = 0 if a.no_mtp else 1

    def mat(*shape: int, scale: float = 1.0) -> np.ndarray:   # numpy (..., rows, cols), fan_in = cols
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(a.out, ARCH)
    w.add_name("tiny-qwen35moe-q8_0" if a.q8 else "tiny-qwen35moe-f32")
    w.add_block_count(h["layers"] + nextn)
    w.add_context_length(h["ctx"])
    w.add_embedding_length(D)
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_dimension_count(h["rope_dim"])
    w.add_array(f"{ARCH}.rope.dimension_sections", h["sections"])
    w.add_rope_freq_base(h["rope_base"])
    w.add_layer_norm_rms_eps(h["eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(h["top_k"])
    w.add_uint32(f"{ARCH}.expert_feed_forward_length", X)
    w.add_uint32(f"{ARCH}.expert_shared_feed_forward_length", SX)
    if h["interval"]:
        w.add_uint32(f"{ARCH}.full_attention_interval", h["interval"])
    w.add_uint32(f"{ARCH}.ssm.conv_kernel", h["d_conv"])
    w.add_uint32(f"{ARCH}.ssm.state_size", S)
    w.add_uint32(f"{ARCH}.ssm.group_count", HK)
    w.add_uint32(f"{ARCH}.ssm.time_step_rank", HV)
    w.add_uint32(f"{ARCH}.ssm.inner_size", HV * S)
    if nextn:
        w.add_uint32(f"{ARCH}.nextn_predict_layers", nextn)
    add_tokenizer(w, tokens, types, merges, QWEN3_TEMPLATE)
    interval = h["interval"] or 4     # the layout llama.cpp assumes without the key
    add_tensor = w.add_tensor

    def put(name: str, arr: np.ndarray) -> None:
        """Matrices (2-D and up, not the routers) Q8_0 under --q8; the rest F32."""
        if a.q8 and arr.ndim >= 2 and "gate_inp" not in name and "conv1d" not in name:
            add_tensor(name, quantize(arr, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            add_tensor(name, arr)

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

    for l in range(h["layers"] + nextn):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", norm_w(D))
        put(p + "post_attention_norm.weight", norm_w(D))
        if l < h["layers"] and (l + 1) % interval != 0:
            put(p + "attn_qkv.weight", mat(CH, D))
            put(p + "attn_gate.weight", mat(HV * S, D))
            put(p + "ssm_conv1d.weight", mat(CH, h["d_conv"], scale=1.5))
            put(p + "ssm_dt.bias", rng.uniform(-1.0, 1.0, HV).astype(np.float32))
            # ssm_a = -exp(A_log), A_log ~ U(0, log 16) as Qwen3-Next's initialisation
            put(p + "ssm_a", (-np.exp(rng.uniform(0.0, np.log(16.0), HV))).astype(np.float32))
            put(p + "ssm_beta.weight", mat(HV, D, scale=2.0))
            put(p + "ssm_alpha.weight", mat(HV, D, scale=2.0))
            put(p + "ssm_norm.weight", norm_w(S))
            put(p + "ssm_out.weight", mat(D, HV * S))
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
