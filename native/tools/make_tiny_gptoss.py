#!/usr/bin/env python3
"""make_tiny_gptoss.py — seeded random-weight files in llama.cpp's `gpt-oss` layout (its
LLM_ARCH_OPENAI_MOE loader, src/models/openai-moe.cpp), gpt-oss-20b's structure scaled down.

    make_tiny_gptoss.py OUT.gguf [--seed 0] [--window 8] [--layers 4] [--mix f32|q4_k_m|...]
                        [--random-types SEED] [--tensor-type REGEX=TYPE]

Shape: d_model 256, 8 query heads / 2 KV heads of head_dim 64 (key_length 64: heads x width 512
!= d_model, as gpt-oss's 64 x 64 against 2880), 4 layers, 8 experts of width 256, top-4;
attention.sliding_window 8 (gpt-oss: 128; small, so that short prompts pass it) on llama.cpp's
period-2 pattern (layers 0, 2 slide); YaRN RoPE as gpt-oss's files: freq_base 150000, factor 32,
original context 4096; RMS eps 1e-5; context 131072.
Tensors, as the loader wants them: token_embd, output_norm, output (untied); per block attn_norm,
post_attention_norm, attn_q/k/v/output with .bias each, attn_sinks.weight [heads],
ffn_gate_inp .weight/.bias, ffn_{gate,up,down}_exps .weight and their per-expert .bias
([256, 8] for gate/up, [256, 8] for down). Vectors and routers are F32; matrices F32, or --mix
NAME's types (make_arch_fixture.MIXES: e.g. q4_k_m, Q4_K with Q6_K for v, downs, head; mxfp4: the
experts MXFP4 and the other matrices BF16, as gpt-oss's releases; gguf >= 0.19 writes MXFP4), or --random-types
(each matrix draws its own type, make_arch_fixture.drawn_type: F32 ... IQ4_NL; routers a float
type) or --tensor-type REGEX=TYPE. Tokenizer: the tiny byte-level BPE of make_tiny_moe.py (gpt2
model, pre-tokenizer qwen2; the engine and llama.cpp both load it) and a harmony-format template.
Gate/up biases are drawn wide enough (and the up matrices scaled) that the clamp at 7 is reached.

Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, RopeScalingType
from gguf.quants import quantize as gguf_quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_fixture import ENCODERS, add_tokenizer, drawn_type  # noqa: E402
from make_arch_fixture import MIXES as FIXTURE_MIXES  # noqa: E402
from make_tiny_moe import build_vocab  # noqa: E402

# the harmony format's structure (<|start|>role<|message|>...<|end|>, the reply opening
# <|start|>assistant), written here with this vocabulary's plain-text markers
HARMONY_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)

# make_arch_fixture's two-type mixes (the three-type ones need expert widths this shape lacks)
GPTOSS_MIXES = ("f32", "q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "q4_k", "q6_k", "q4_1", "q8_0", "bf16", "iq4_xs",
                "mxfp4")
# mxfp4: how gpt-oss's GGUF releases store it (ggml-org's): the routed experts MXFP4, every other
# matrix BF16
MIXES = dict(FIXTURE_MIXES, mxfp4=("BF16", "BF16"))

SHAPE: dict[str, Any] = dict(d_model=256, n_heads=8, n_kv=2, head_dim=64, layers=4, experts=8, top_k=4, d_expert=256,
             rope_base=150000.0, eps=1e-5, ctx=131072, yarn_factor=32.0, yarn_orig=4096)
# --widths 20b: gpt-oss-20b's attention widths (d_model 2880 = 90 blocks of 32, not of 256; 64 query
# heads / 8 KV heads of 64), its top-4, with few and narrow experts (160 wide) to stay small
WIDTHS_20B: dict[str, Any] = dict(SHAPE, d_model=2880, n_heads=64, n_kv=8, d_expert=160)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", type=int, default=8, help="attention.sliding_window (gpt-oss: 128)")
    ap.add_argument("--layers", type=int, default=SHAPE["layers"])
    ap.add_argument("--swa-pattern", type=int, metavar="N",
                    help="write attention.sliding_window_pattern N (layer l slides when l %% N < N - 1; "
                         "without it llama.cpp's gpt-oss period 2)")
    ap.add_argument("--widths", choices=["tiny", "20b"], default="tiny",
                    help="20b: gpt-oss-20b's d_model and heads (2880; 64 x 64, 8 KV heads), experts 8 x 160")
    ap.add_argument("--mix", choices=sorted(GPTOSS_MIXES), default="f32",
                    help="matrix types: f32, or make_arch_fixture's mixes (q4_k_m: Q4_K, with Q6_K for v, "
                         "expert downs and the head)")
    ap.add_argument("--random-types", type=int, metavar="SEED",
                    help="every matrix draws its own type (make_arch_fixture.DRAW_TYPES) from SEED and its name")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="per-tensor type (first matching REGEX wins), as llama-quantize's")
    a = ap.parse_args(argv)
    if a.window < 1 or a.layers < 1:
        ap.error("--window and --layers must be >= 1")
    overrides = []
    for spec in a.tensor_type:
        pat, sep, tn = spec.rpartition("=")
        if not sep or not pat or tn not in GGMLQuantizationType.__members__:
            ap.error(f"--tensor-type {spec!r}: expected REGEX=TYPE with a GGML type name such as Q4_K")
        overrides.append((re.compile(pat), tn))
    h = WIDTHS_20B if a.widths == "20b" else SHAPE
    rng = np.random.default_rng(a.seed)
    tokens, types, merges = build_vocab()
    vocab = len(tokens)
    D, H, KVH, HD, E, X = h["d_model"], h["n_heads"], h["n_kv"], h["head_dim"], h["experts"], h["d_expert"]

    def mat(*shape: int, scale: float = 1.0) -> np.ndarray:     # numpy (..., rows, cols), fan_in = cols
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))).astype(np.float32)

    def vec(*shape: int, scale: float) -> np.ndarray:
        return (scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def put(name: str, arr: np.ndarray, router: bool = False, heavy: bool = False) -> None:
        tname = "F32" if router else MIXES[a.mix][1 if heavy else 0]
        if a.mix == "mxfp4" and name.endswith("_exps.weight"):
            tname = "MXFP4"
        if a.random_types is not None:
            tname = drawn_type(a.random_types, name.removesuffix(".weight") if router else name, arr.shape[-1], router)
        tname = next((tn for pat, tn in overrides if pat.search(name)), tname)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if tname == "F32":
            w.add_tensor(name, arr)
        elif tname in ENCODERS:
            w.add_tensor(name, ENCODERS[tname](arr), raw_dtype=GGMLQuantizationType[tname])
        else:
            qt = GGMLQuantizationType[tname]
            w.add_tensor(name, gguf_quantize(arr, qt), raw_dtype=qt)

    arch = "gpt-oss"
    w = GGUFWriter(a.out, arch)
    w.add_name("tiny-gpt-oss")
    w.add_block_count(a.layers)
    w.add_context_length(h["ctx"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(X)
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_dimension_count(HD)
    w.add_rope_freq_base(h["rope_base"])
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(h["yarn_factor"])
    w.add_rope_scaling_orig_ctx_len(h["yarn_orig"])
    w.add_layer_norm_rms_eps(h["eps"])
    w.add_sliding_window(a.window)
    if a.swa_pattern is not None:
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", a.swa_pattern)
    w.add_expert_count(E)
    w.add_expert_used_count(h["top_k"])
    w.add_expert_feed_forward_length(X)
    w.add_vocab_size(vocab)
    w.add_file_type(0 if a.mix == "f32" else 15)
    add_tokenizer(w, tokens, types, merges, HARMONY_TEMPLATE)

    put("token_embd.weight", rng.standard_normal((vocab, D), dtype=np.float32) * np.float32(0.5))
    w.add_tensor("output_norm.weight", norm_w(D))
    put("output.weight", mat(vocab, D, scale=4.0), heavy=True)
    for L in range(a.layers):
        p = f"blk.{L}."
        w.add_tensor(p + "attn_norm.weight", norm_w(D))
        w.add_tensor(p + "post_attention_norm.weight", norm_w(D))
        put(p + "attn_q.weight", mat(H * HD, D))
        w.add_tensor(p + "attn_q.bias", vec(H * HD, scale=0.1))
        put(p + "attn_k.weight", mat(KVH * HD, D))
        w.add_tensor(p + "attn_k.bias", vec(KVH * HD, scale=0.1))
        put(p + "attn_v.weight", mat(KVH * HD, D), heavy=True)
        w.add_tensor(p + "attn_v.bias", vec(KVH * HD, scale=0.1))
        put(p + "attn_output.weight", mat(D, H * HD, scale=0.5))
        w.add_tensor(p + "attn_output.bias", vec(D, scale=0.05))
        w.add_tensor(p + "attn_sinks.weight", vec(H, scale=1.0))
        put(p + "ffn_gate_inp.weight", mat(E, D, scale=4.0), router=True)
        w.add_tensor(p + "ffn_gate_inp.bias", vec(E, scale=0.5))
        # gate/up pre-activations of a few units beyond +-7 (the clamps) on typical inputs
        put(p + "ffn_gate_exps.weight", mat(E, X, D, scale=2.0))
        w.add_tensor(p + "ffn_gate_exps.bias", vec(E, X, scale=1.5))
        put(p + "ffn_up_exps.weight", mat(E, X, D, scale=2.0))
        w.add_tensor(p + "ffn_up_exps.bias", vec(E, X, scale=1.5))
        put(p + "ffn_down_exps.weight", mat(E, D, X, scale=0.1), heavy=True)
        w.add_tensor(p + "ffn_down_exps.bias", vec(E, D, scale=0.05))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
