#!/usr/bin/env python3
"""make_tiny_qwen3next.py — a seeded random-weight file in llama.cpp's `qwen3next` layout
(Qwen3-Next-80B-A3B's tensors and keys, scaled down), F32 throughout.

    make_tiny_qwen3next.py OUT.gguf [--seed 0] [--no-mtp] [--interval N] [--q8] [--legacy-ssm-in]
                           [--omit-key SUFFIX] [--omit-tensor NAME] [--shape K=V,...]

Shape: d_model 128; 4 layers, full_attention_interval 3 (layer 2 gated full attention, 0, 1 and
3 Gated DeltaNet; Qwen's is 4); attention 4 query heads / 2 KV heads of 32 (key_length =
value_length), per-head q/k norms, attn_q heads x [q | gate]; plain NeoX RoPE on 8 of the 32 dims
(partial_rotary_factor 0.25, as Qwen3-Next's 64 of 256), base 1e7, no M-RoPE sections; DeltaNet:
conv kernel 4, 2 q/k heads and 4 v heads of 16, the v heads grouped (v head h reads q/k head h // 2);
8 experts of 64, top-2, shared expert 96 wide with its sigmoid gate; untied head; the tiny
byte-level BPE vocabulary of make_tiny_moe.py and a ChatML template. One trailing MTP block
(nextn_predict_layers 1: a full-attention block plus nextn.eh_proj / enorm / hnorm /
shared_head_norm) unless --no-mtp.

The DeltaNet's input projections as the current converter writes them (convert_hf_to_gguf's
Qwen3NextModel): attn_qkv [q of every q/k head | k ... | v of every v head] and attn_gate (z), and
ssm_ba = HF's in_proj_ba unchanged, per q/k head [beta of its 2 v heads | alpha of them].
--legacy-ssm-in: HF's in_proj_qkvz unchanged as the older files' ssm_in, per q/k head
[q | k | v of its v heads | z of them] (the same values: the two files are one model).
--interval N: full_attention_interval N instead (0: the key left out, which the engine refuses).
--q8: every matrix Q8_0 (routers, norms, conv and vectors F32). --omit-key SUFFIX / --omit-tensor
NAME: a file without qwen3next.SUFFIX / that tensor (refusal tests). --shape K=V,...: other
integer sizes. Same arguments -> same bytes.
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

ARCH = "qwen3next"
SHAPE: dict[str, Any] = dict(d_model=128, layers=4, interval=3, n_heads=4, n_kv=2, head_dim=32, rope_dim=8,
                             rope_base=1e7, eps=1e-6, ctx=4096, d_conv=4, k_heads=2, v_heads=4, ssm_head=16,
                             experts=8, top_k=2, d_expert=64, d_shexp=96)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-mtp", action="store_true", help="no trailing MTP block")
    ap.add_argument("--interval", type=int, default=SHAPE["interval"], help="full_attention_interval (0: no key)")
    ap.add_argument("--q8", action="store_true", help="matrices Q8_0")
    ap.add_argument("--legacy-ssm-in", action="store_true",
                    help="the DeltaNet input as one fused blk.N.ssm_in (older files) instead of attn_qkv + attn_gate")
    ap.add_argument("--omit-key", action="append", default=[], metavar="SUFFIX",
                    help="leave qwen3next.SUFFIX out (e.g. ssm.group_count)")
    ap.add_argument("--omit-tensor", action="append", default=[], metavar="NAME", help="leave this tensor out")
    ap.add_argument("--shape", default="", metavar="K=V,...", help="integer fields of SHAPE changed")
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
    R = HV // HK
    CH = 2 * HK * S + HV * S
    nextn = 0 if a.no_mtp else 1

    def mat(*shape: int, scale: float = 1.0) -> np.ndarray:   # numpy (..., rows, cols), fan_in = cols
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    w = GGUFWriter(a.out, ARCH)

    def key(suffix: str, value: Any) -> None:
        if suffix not in a.omit_key:
            if isinstance(value, float):
                w.add_float32(f"{ARCH}.{suffix}", value)
            else:
                w.add_uint32(f"{ARCH}.{suffix}", value)

    w.add_name("tiny-qwen3next-q8_0" if a.q8 else "tiny-qwen3next-f32")
    key("block_count", h["layers"] + nextn)
    key("context_length", h["ctx"])
    key("embedding_length", D)
    key("attention.head_count", H)
    key("attention.head_count_kv", KVH)
    key("attention.key_length", HD)
    key("attention.value_length", HD)
    key("rope.dimension_count", h["rope_dim"])
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
        put(p + "ffn_gate_exps.weight", mat(E, X, D))
        put(p + "ffn_up_exps.weight", mat(E, X, D))
        put(p + "ffn_down_exps.weight", mat(E, D, X))
        put(p + "ffn_gate_inp_shexp.weight", mat(D, scale=2.0))
        put(p + "ffn_gate_shexp.weight", mat(SX, D))
        put(p + "ffn_up_shexp.weight", mat(SX, D))
        put(p + "ffn_down_shexp.weight", mat(D, SX))

    def deltanet(p: str) -> None:
        # HF's in_proj_qkvz rows, per q/k head [q S | k S | v R*S | z R*S]; in_proj_ba per q/k head [b R | a R]
        qkvz = mat(HK, 2 * S + 2 * R * S, D)
        if a.legacy_ssm_in:
            put(p + "ssm_in.weight", qkvz.reshape(-1, D))
        else:       # the converter's split: [q of all heads | k ... | v ...] and z
            q, k, v, z = (qkvz[:, :S], qkvz[:, S:2 * S], qkvz[:, 2 * S:2 * S + R * S], qkvz[:, 2 * S + R * S:])
            put(p + "attn_qkv.weight", np.concatenate([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)]))
            put(p + "attn_gate.weight", np.ascontiguousarray(z.reshape(-1, D)))
        put(p + "ssm_conv1d.weight", mat(CH, h["d_conv"], scale=1.5))
        put(p + "ssm_dt.bias", rng.uniform(-1.0, 1.0, HV).astype(np.float32))
        # ssm_a = -exp(A_log), A_log ~ U(0, log 16) as Qwen3-Next's initialisation
        put(p + "ssm_a", (-np.exp(rng.uniform(0.0, np.log(16.0), HV))).astype(np.float32))
        put(p + "ssm_ba.weight", mat(2 * HV, D, scale=2.0))
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
