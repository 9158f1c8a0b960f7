#!/usr/bin/env python3
"""make_tiny_qwen35moe.py — a seeded random-weight file in llama.cpp's `qwen35moe` layout
(Qwen3.5 / Qwen3.6-35B-A3B's tensors and keys, scaled down), F32 throughout.

    make_tiny_qwen35moe.py OUT.gguf [--seed 0] [--no-mtp]

Shape: d_model 128; 4 layers, full_attention_interval 3 (layer 2 gated full attention, 0, 1
and 3 Gated DeltaNet: the interval is the file's, not Qwen's 4); attention 4 query heads / 2 KV
heads of 32 (key_length = value_length), per-head q/k norms, attn_q heads x [q | gate]; RoPE on
16 of 32 dims, base 1e7, interleaved M-RoPE sections [3, 2, 2, 1] (the 8th pair is the 4th
section's: it does not turn for text); DeltaNet: conv kernel 4, 2 q/k heads and 4 v heads of 16
(v head h reads q/k head h mod 2); 8 experts of 64, top-2, shared expert 96 wide with its sigmoid
gate; untied head; the tiny byte-level BPE vocabulary of make_tiny_moe.py and a ChatML template.
One trailing MTP block (nextn_predict_layers 1: nextn.eh_proj / enorm / hnorm and a full
attention + MoE block) unless --no-mtp. Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

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
    a = ap.parse_args(argv)
    h = SHAPE
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
    w.add_name("tiny-qwen35moe-f32")
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
    w.add_uint32(f"{ARCH}.full_attention_interval", h["interval"])
    w.add_uint32(f"{ARCH}.ssm.conv_kernel", h["d_conv"])
    w.add_uint32(f"{ARCH}.ssm.state_size", S)
    w.add_uint32(f"{ARCH}.ssm.group_count", HK)
    w.add_uint32(f"{ARCH}.ssm.time_step_rank", HV)
    w.add_uint32(f"{ARCH}.ssm.inner_size", HV * S)
    if nextn:
        w.add_uint32(f"{ARCH}.nextn_predict_layers", nextn)
    add_tokenizer(w, tokens, types, merges, QWEN3_TEMPLATE)

    w.add_tensor("token_embd.weight", mat(V, D, scale=np.sqrt(D) * 0.5))
    w.add_tensor("output_norm.weight", norm_w(D))
    w.add_tensor("output.weight", mat(V, D, scale=2.0))

    def attention(p: str) -> None:
        w.add_tensor(p + "attn_q.weight", mat(2 * H * HD, D))
        w.add_tensor(p + "attn_k.weight", mat(KVH * HD, D))
        w.add_tensor(p + "attn_v.weight", mat(KVH * HD, D))
        w.add_tensor(p + "attn_output.weight", mat(D, H * HD))
        w.add_tensor(p + "attn_q_norm.weight", norm_w(HD))
        w.add_tensor(p + "attn_k_norm.weight", norm_w(HD))

    def moe(p: str) -> None:
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, D, scale=2.0))
        w.add_tensor(p + "ffn_gate_exps.weight", mat(E, X, D))
        w.add_tensor(p + "ffn_up_exps.weight", mat(E, X, D))
        w.add_tensor(p + "ffn_down_exps.weight", mat(E, D, X))
        w.add_tensor(p + "ffn_gate_inp_shexp.weight", mat(D, scale=2.0))
        w.add_tensor(p + "ffn_gate_shexp.weight", mat(SX, D))
        w.add_tensor(p + "ffn_up_shexp.weight", mat(SX, D))
        w.add_tensor(p + "ffn_down_shexp.weight", mat(D, SX))

    for l in range(h["layers"] + nextn):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", norm_w(D))
        w.add_tensor(p + "post_attention_norm.weight", norm_w(D))
        if l < h["layers"] and (l + 1) % h["interval"] != 0:
            w.add_tensor(p + "attn_qkv.weight", mat(CH, D))
            w.add_tensor(p + "attn_gate.weight", mat(HV * S, D))
            w.add_tensor(p + "ssm_conv1d.weight", mat(CH, h["d_conv"], scale=1.5))
            w.add_tensor(p + "ssm_dt.bias", rng.uniform(-1.0, 1.0, HV).astype(np.float32))
            # ssm_a = -exp(A_log), A_log ~ U(0, log 16) as Qwen3-Next's initialisation
            w.add_tensor(p + "ssm_a", (-np.exp(rng.uniform(0.0, np.log(16.0), HV))).astype(np.float32))
            w.add_tensor(p + "ssm_beta.weight", mat(HV, D, scale=2.0))
            w.add_tensor(p + "ssm_alpha.weight", mat(HV, D, scale=2.0))
            w.add_tensor(p + "ssm_norm.weight", norm_w(S))
            w.add_tensor(p + "ssm_out.weight", mat(D, HV * S))
        else:
            attention(p)
        moe(p)
        if l >= h["layers"]:
            w.add_tensor(p + "nextn.eh_proj.weight", mat(D, 2 * D))
            w.add_tensor(p + "nextn.enorm.weight", norm_w(D))
            w.add_tensor(p + "nextn.hnorm.weight", norm_w(D))
            w.add_tensor(p + "nextn.shared_head_norm.weight", norm_w(D))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
