#!/usr/bin/env python3
"""make_arch_fixture.py — seeded random-weight MoE fixtures in the exact GGUF layouts of the
architectures llama.cpp names (issue 15), with a K-quant mix like the files people have.

    make_arch_fixture.py OUT.gguf --arch qwen3moe [--seed 0] [--f32]

qwen3moe (llama.cpp's QWEN3MOE tensors and keys; Qwen3-30B-A3B's shape, scaled down):
  d_model 256, 4 query heads / 2 KV heads of head_dim 128 (key_length != d_model / heads, as
  Qwen3), 2 layers, 8 experts of width 256, top-2 with expert_weights_norm, NeoX RoPE base 1e6,
  RMS eps 1e-6, untied output head; tokenizer gpt2 / pre "qwen2" (the tiny BPE vocabulary of
  make_tiny_moe.py), a template in Qwen3's ChatML format (each architecture gets its family's).
  Tensors: token_embd Q4_K, output Q6_K, output_norm F32; per block attn_norm / ffn_norm F32,
  attn_q / attn_k / attn_output Q4_K, attn_v Q6_K, attn_q_norm / attn_k_norm F32 [head_dim],
  ffn_gate_inp F32 [d_model, E], ffn_gate_exps / ffn_up_exps Q4_K [d_model, 256, E],
  ffn_down_exps Q6_K [256, d_model, E] — Q4_K_M's mix (Q6_K for v, down and the head).
  --f32: every matrix F32 (the same random values), for oracle checks free of quantization.
  --mix NAME: other weight-type mixes (MIXES below), e.g. iq4_xs; ud_q2_k_xl is a dynamic mix
  in the manner of the "UD" files (see ud_q2_k_xl_type): gate, up and down of a layer of
  different K types, attention Q4_K / Q6_K, head Q6_K; ud_iq2_m the same with IQ2_XXS / IQ2_XS
  experts (see ud_iq2_m_type).
  --random-types SEED: every matrix independently draws its type (DRAW_TYPES, where its width
  allows) from a generator seeded by SEED and the tensor's name; routers draw a float type.
  --tensor-type REGEX=TYPE (repeatable, first match wins): llama-quantize's per-tensor override,
  applied after the mix, e.g. --tensor-type 'ffn_up_exps=Q3_K'.
  --value-length N (qwen3moe, glm4moe: the architectures whose head widths are their own keys):
  attention.value_length N != key_length, so attn_v is head_count_kv x N and attn_output reads
  head_count x N (llama.cpp's graphs for these assert equal widths; deepseek2's MLA does not).
  --arch llama: Mixtral's layout on llama.cpp's llama architecture; --split-experts writes its
  experts as older llama.cpp files do, one tensor per expert (blk.N.ffn_gate.E.weight ...).
  --fuse-gate-up: the routed experts' gate and up as one blk.N.ffn_gate_up_exps [d_model, 2 x
  d_expert, E], each expert's gate rows then its up rows (llama.cpp's layout), of the gate's type.

Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize as gguf_quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kquant import quant_iq4_nl, quant_iq4_xs, quant_q2_k, quant_q3_k, quant_q4_k, quant_q5_k, quant_q6_k  # noqa: E402
from iqquant import ENCODERS as IQ_ENCODERS  # noqa: E402
from make_tiny_moe import build_vocab  # noqa: E402

# Chat templates in each family's prompt format (written here, not the published files: the
# same markers and structure, the jinja features those templates use — namespace, loop
# variables, strftime_now, enable_thinking, raise_exception — so the web app's renderer is
# exercised on them).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
QWEN2_TEMPLATE = (
    "{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
OLMOE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ '<|system|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<|assistant|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
    "{% endfor %}"
)
GRANITE_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system_message = 'Knowledge Cutoff Date: April 2024.\\nToday\\'s Date: ' + "
    "strftime_now('%B %d, %Y') + '.\\nYou are Granite, developed by IBM.' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\\n' }}"
    "{%- for message in loop_messages %}"
    "{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}"
    "{%- if loop.last and add_generation_prompt %}{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif %}"
    "{%- endfor %}"
)
MIXTRAL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + ' [/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}{{- message['content'] + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported!') }}{%- endif %}"
    "{%- endfor %}"
)
GLM4_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and loop.index0 > ns.last_user %}{{- '<|assistant|>\\n' + m.content }}"
    "{%- else %}{{- '<|' + m.role + '|>\\n' + m.content }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{- '\\n<think></think>' }}{%- endif %}"
    "{%- endif %}"
)

BASE = dict(d_model=256, n_heads=4, n_kv=2, head_dim=64, layers=2, experts=8, top_k=2, d_expert=256,
            rope_base=1e6, eps=1e-6, ctx=4096, qk_norm=None, bias=False, shexp=0, shexp_gate=False,
            tied=False, dense_lead=0, d_ff=512, nextn=0, rope_dim=None, norm=None, extra={},
            expert_width_key="expert_feed_forward_length")
ARCHS = {
    # Qwen3-MoE: head_dim != d_model / heads, per-head q/k norms, renormalised top-k
    "qwen3moe": dict(BASE, template=QWEN3_TEMPLATE, head_dim=128, qk_norm="head", norm=True),
    # OLMoE: MHA, q/k norms over the whole projection, no renormalisation
    "olmoe": dict(BASE, template=OLMOE_TEMPLATE, n_kv=4, rope_base=1e4, eps=1e-5, qk_norm="full", norm=False,
                  expert_width_key="feed_forward_length"),
    # Qwen2-MoE: q/k/v biases, shared expert with its sigmoid gate, no renormalisation
    "qwen2moe": dict(BASE, template=QWEN2_TEMPLATE, bias=True, shexp=512, shexp_gate=True, norm=False),
    # granite-3.x MoE: llama layout, tied head, Granite's four multipliers (granite-3.0-1b-a400m's)
    "granitemoe": dict(BASE, template=GRANITE_TEMPLATE, rope_base=1e4, eps=1e-6, tied=True,
                       expert_width_key="feed_forward_length", extra={
        "embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625, "logit_scale": 6.0}),
    # GLM-4.5: head_dim 128, partial RoPE (64 of 128), biases, a leading dense block, sigmoid
    # router with selection bias in 2 groups (1 used), scale 2.5, shared expert, one MTP block
    "glm4moe": dict(BASE, template=GLM4_TEMPLATE, head_dim=128, layers=3, dense_lead=1, bias=True, shexp=256, nextn=1, rope_dim=64,
                    norm=True, rope_base=1e6, eps=1e-5, extra={
                        "expert_gating_func": 2, "expert_weights_scale": 2.5, "expert_shared_count": 1,
                        "expert_group_count": 2,
                        "expert_group_used_count": 1}),
}

# Mixtral's layout on llama.cpp's `llama` architecture (not in ARCHS: the new architectures,
# which tests/native/test_arch_mux.py runs one by one): interleaved RoPE, softmax router with the
# top-k renormalised, experts sized by feed_forward_length (llama.cpp's llama loader);
# --split-experts writes older llama.cpp files' one tensor per expert (blk.N.ffn_gate.E.weight ...)
LLAMA = dict(BASE, template=MIXTRAL_TEMPLATE, rope_base=1e6, eps=1e-5, rope_dim=64,
             expert_width_key="feed_forward_length")

# mix -> (type of the "q4k" matrices, type of the "q6k" ones: attention v, expert downs, head),
# after llama.cpp's file types of those names (their exact per-tensor rules vary by version)
MIXES = {
    "q4_k_m": ("Q4_K", "Q6_K"), "q5_k_m": ("Q5_K", "Q6_K"), "q3_k_m": ("Q3_K", "Q5_K"),
    "q2_k": ("Q2_K", "Q4_K"), "q4_k": ("Q4_K", "Q4_K"), "q6_k": ("Q6_K", "Q6_K"),
    "q4_1": ("Q4_1", "Q4_1"), "q8_0": ("Q8_0", "Q8_0"), "bf16": ("BF16", "BF16"), "f32": ("F32", "F32"),
    # a third type: the expert downs', with experts 352 wide (1408 / 4: Qwen1.5-MoE's and GLM-4.5-Air's
    # 1408, not a multiple of 256, so llama.cpp's quantizer falls back to Q5_0 / Q5_1 for those rows)
    "q4_k_m_q5_0": ("Q4_K", "Q6_K", "Q5_0"), "q5_k_m_q5_1": ("Q5_K", "Q6_K", "Q5_1"),
    # IQ4_XS: llama.cpp's quantizer keeps some tensors of an IQ4_XS file at other types (MIX_TENSORS);
    # iq4_xs_nl: experts 352 wide, whose downs it writes as IQ4_NL (its fallback for rows that are
    # not a multiple of 256)
    "iq4_xs": ("IQ4_XS", "IQ4_XS"), "iq4_xs_nl": ("IQ4_XS", "IQ4_XS", "IQ4_NL"),
}
# per-tensor types of a mix, by name without the "blk.N." prefix: what llama.cpp's
# llama_tensor_get_type picks for an IQ4_XS file of these fixtures (8 experts, 2 query heads per
# KV head, no imatrix): the head Q6_K; with 8 experts attn_k / attn_v Q8_0 and attn_output Q5_K
# (its ffn_down bump to Q5_K covers the first n_layer / 8 layers: none of 2 or 3)
IQ4_TENSORS = {"output.weight": "Q6_K", "attn_k.weight": "Q8_0", "attn_v.weight": "Q8_0",
               "attn_output.weight": "Q5_K"}
MIX_TENSORS = {"iq4_xs": IQ4_TENSORS, "iq4_xs_nl": IQ4_TENSORS}
# q4_k_m above gives every attention v and expert down Q6_K (the heaviest Q4_K_M); llama.cpp's
# quantizer gives them Q6_K only in the layers its use_more_bits picks (the first and last eighth
# and every third layer between: 4 of 8, 24 of 48) and Q4_K elsewhere, the head Q6_K, and with 8
# experts attn_k / attn_v Q8_0 and attn_output Q5_K. q4_k_m_file is that mix: what a Q4_K_M file
# people download holds, for the speed comparison per weight byte.
MIXES["q4_k_m_file"] = ("Q4_K", "Q6_K")
MIXES["ud_q2_k_xl"] = ("Q2_K", "Q6_K")
MIXES["ud_iq2_m"] = ("IQ2_XS", "Q6_K")

# --random-types draws from every type the engine computes with (K-quants and IQ4_XS need rows
# of whole 256-blocks, the rest whole 32-blocks); routers from the float types llama.cpp's
# converters write (it never quantizes a router).
DRAW_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
              "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "MXFP4",
              "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
ROUTER_TYPES = ("F32", "F16", "BF16")
SUPER_BLOCK_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS",
                     "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"}


def drawn_type(seed, name, cols, router=False):
    """The type --random-types gives tensor `name` (rows of `cols` values): independent per
    tensor, the same for the same seed and name."""
    import zlib
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    pool = ROUTER_TYPES if router else [t for t in DRAW_TYPES if cols % (256 if t in SUPER_BLOCK_TYPES else 32) == 0]
    return str(pool[rng.integers(len(pool))])


# the IQ ladder of the dynamic IQ files: each expert down one step above its gate / up
IQ_STEP_UP = {"IQ1_S": "IQ1_M", "IQ1_M": "IQ2_XXS", "IQ2_XXS": "IQ2_XS", "IQ2_XS": "IQ2_S", "IQ2_S": "IQ3_XXS",
              "IQ3_XXS": "IQ3_S", "IQ3_S": "IQ4_XS"}


def ud_iq2_m_type(name, kind):
    """A dynamic IQ mix of the kind the "UD-IQ2_M" files hold: routed gate IQ2_XXS and up IQ2_XS on
    even layers (the other way on odd ones), each down one step above its up; attention Q4_K with v
    Q6_K, shared experts and dense FFNs Q4_K with Q6_K downs, embedding Q4_K, head Q6_K."""
    if not name.startswith("blk."):
        return "Q4_K" if kind == "q4k" else "Q6_K"
    layer, rest = int(name.split(".")[1]), name.split(".", 2)[2]
    gate, up = ("IQ2_XXS", "IQ2_XS") if layer % 2 == 0 else ("IQ2_XS", "IQ2_XXS")
    if rest.startswith("ffn_gate_exps"):
        return gate
    if rest.startswith("ffn_up_exps"):
        return up
    if rest.startswith("ffn_down_exps"):
        return IQ_STEP_UP[up]
    if rest.startswith("attn_v") or rest.startswith("ffn_down"):
        return "Q6_K"
    return "Q4_K"


def ud_q2_k_xl_type(name, kind):
    """A dynamic 2-bit mix of the kind the "UD-Q2_K_XL" files hold: attention Q4_K with v Q6_K,
    routed gate Q2_K and up Q3_K on even layers (Q3_K / Q2_K on odd ones: a layer's gate and up
    of different types either way), each down one step above its up, shared experts and dense
    FFNs Q4_K with Q6_K downs, embedding Q4_K, head Q6_K."""
    if not name.startswith("blk."):
        return "Q4_K" if kind == "q4k" else "Q6_K"
    layer, rest = int(name.split(".")[1]), name.split(".", 2)[2]
    step_up = {"Q2_K": "Q3_K", "Q3_K": "Q4_K"}
    gate, up = ("Q2_K", "Q3_K") if layer % 2 == 0 else ("Q3_K", "Q2_K")
    if rest.startswith("ffn_gate_exps") or rest.startswith("ffn_gate."):
        return gate
    if rest.startswith("ffn_up_exps") or rest.startswith("ffn_up."):
        return up
    if rest.startswith("ffn_down_exps") or rest.startswith("ffn_down."):
        return step_up[up]
    if rest.startswith("attn_v"):
        return "Q6_K"
    return "Q4_K" if kind == "q4k" else "Q6_K"


def use_more_bits(i_layer, n_layer):
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def q4_k_m_file_type(name, kind, n_layer, n_expert):
    """The type llama.cpp's Q4_K_M rules give tensor `name` (kind: q4k, q6k or down)."""
    if not name.startswith("blk."):
        return "Q6_K" if kind != "q4k" else "Q4_K"
    layer, rest = int(name.split(".")[1]), name.split(".", 2)[2]
    if n_expert == 8 and rest in ("attn_k.weight", "attn_v.weight"):
        return "Q8_0"
    if n_expert == 8 and rest == "attn_output.weight":
        return "Q5_K"
    return "Q6_K" if kind != "q4k" and use_more_bits(layer, n_layer) else "Q4_K"
ENCODERS = {"Q2_K": quant_q2_k, "Q3_K": quant_q3_k, "Q4_K": quant_q4_k, "Q5_K": quant_q5_k, "Q6_K": quant_q6_k,
            "IQ4_XS": quant_iq4_xs, "IQ4_NL": quant_iq4_nl, **IQ_ENCODERS}


def add_tokenizer(w, tokens, types, merges, template):
    """The fixtures' tokenizer keys: byte-level BPE (gpt2, pre-tokenizer qwen2), eos 2, no BOS."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(template)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    archs = dict(ARCHS, llama=LLAMA)    # looked up when called (tests adjust ARCHS in-process)
    ap.add_argument("--arch", choices=sorted(archs), required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--f32", action="store_true", help="every matrix F32 (no weight quantization)")
    ap.add_argument("--mix", choices=sorted(MIXES), default="q4_k_m",
                    help="matrix types (see MIXES): q4_k_m, the default, is Q4_K with Q6_K for v / downs / head")
    ap.add_argument("--random-types", type=int, metavar="SEED",
                    help="every matrix draws its own type (DRAW_TYPES) from SEED and its name")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="per-tensor override after the mix (first matching REGEX wins), as llama-quantize's")
    ap.add_argument("--bench-shape", action="store_true",
                    help="a bigger shape for speed tables: d_model 1024, 8 heads x 128, 8 layers, 16 experts "
                         "x 512, top-4")
    ap.add_argument("--split-experts", action="store_true",
                    help="llama only: one tensor per expert, blk.N.ffn_{gate,up,down}.E.weight (older Mixtral files)")
    ap.add_argument("--value-length", type=int, metavar="N",
                    help="qwen3moe / glm4moe: attention.value_length N (v and the attention output N wide per head)")
    ap.add_argument("--fuse-gate-up", action="store_true",
                    help="routed gate and up as one blk.N.ffn_gate_up_exps [d_model, 2 x d_expert, E] (the same values)")
    a = ap.parse_args(argv)
    if a.fuse_gate_up and a.split_experts:
        ap.error("--fuse-gate-up: not with --split-experts")
    if a.split_experts and a.arch != "llama":
        ap.error("--split-experts: only llama files have that layout")
    if a.value_length is not None and (a.arch not in ("qwen3moe", "glm4moe") or not 1 <= a.value_length <= 1024
                                       or a.value_length % 64):
        ap.error("--value-length: qwen3moe or glm4moe, a multiple of 64 up to 1024 (attn_output's rows of "
                 "4 heads x N values are whole K-quant blocks)")
    import re
    overrides = []
    for spec in a.tensor_type:
        pat, sep, tn = spec.rpartition("=")
        if not sep or not pat or tn not in GGMLQuantizationType.__members__:
            ap.error(f"--tensor-type {spec!r}: expected REGEX=TYPE with a GGML type name such as Q4_K")
        overrides.append((re.compile(pat), tn))
    h = archs[a.arch]
    if a.bench_shape:
        h = dict(h, d_model=1024, n_heads=8, n_kv=4, head_dim=128, layers=8 + h["nextn"] * 0, experts=16, top_k=4,
                 d_expert=512, d_ff=2048, shexp=512 if h["shexp"] else 0)
    if a.f32:
        a.mix = "f32"
    if len(MIXES[a.mix]) > 2:
        h = dict(h, d_expert=352)
    rng = np.random.default_rng(a.seed)
    tokens, types, merges = build_vocab()
    vocab = len(tokens)
    D, H, KVH, HD, E, X = h["d_model"], h["n_heads"], h["n_kv"], h["head_dim"], h["experts"], h["d_expert"]
    HDV = a.value_length or HD      # a head's value width

    def mat(*shape, scale=1.0):   # numpy shape (..., rows, cols), fan_in = cols
        return (rng.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(shape[-1]))).astype(np.float32)

    def norm_w(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def put(name, arr, kind, drawn=None):
        if kind == "f32" or drawn == "F32":
            w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
            return
        mix = MIXES[a.mix]
        tname = mix[2] if kind == "down" and len(mix) > 2 else mix[0 if kind == "q4k" else 1]
        tname = MIX_TENSORS.get(a.mix, {}).get(name.split(".", 2)[2] if name.startswith("blk.") else name, tname)
        if a.mix == "q4_k_m_file":
            tname = q4_k_m_file_type(name, kind, h["layers"], E)
        if a.mix == "ud_q2_k_xl":
            tname = ud_q2_k_xl_type(name, kind)
        if a.mix == "ud_iq2_m":
            tname = ud_iq2_m_type(name, kind)
        if a.random_types is not None:
            tname = drawn_type(a.random_types, name, arr.shape[-1])
        tname = next((tn for pat, tn in overrides if pat.search(name)), tname)
        tname = drawn or tname
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if tname == "F32":
            w.add_tensor(name, arr)
        elif tname in ENCODERS:
            w.add_tensor(name, ENCODERS[tname](arr), raw_dtype=GGMLQuantizationType[tname])
        else:
            qt = GGMLQuantizationType[tname]
            w.add_tensor(name, gguf_quantize(arr, qt), raw_dtype=qt)

    arch = a.arch
    w = GGUFWriter(a.out, arch)
    w.add_name(f"tiny-{arch}-{a.mix}")
    w.add_block_count(h["layers"] + h["nextn"])   # GLM counts its MTP blocks in block_count
    w.add_context_length(h["ctx"])
    w.add_embedding_length(D)
    w.add_head_count(H)
    w.add_head_count_kv(KVH)
    w.add_key_length(HD)
    w.add_value_length(HDV)
    w.add_rope_freq_base(h["rope_base"])
    w.add_layer_norm_rms_eps(h["eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(h["top_k"])
    # the expert width under the key llama.cpp reads for the architecture: OLMoE's and Granite's
    # loaders size the stacked experts by feed_forward_length (their converters write only that)
    w.add_uint32(f"{arch}.{h['expert_width_key']}", X)
    if h["norm"] is not None:
        w.add_bool(f"{arch}.expert_weights_norm", h["norm"])
    if h["shexp"]:
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", h["shexp"])
    if h["dense_lead"]:
        w.add_uint32(f"{arch}.leading_dense_block_count", h["dense_lead"])
        w.add_feed_forward_length(h["d_ff"])
    if h["nextn"]:
        w.add_uint32(f"{arch}.nextn_predict_layers", h["nextn"])
    if h["rope_dim"]:
        w.add_rope_dimension_count(h["rope_dim"])
    for k, v in h["extra"].items():
        if isinstance(v, int):
            w.add_uint32(f"{arch}.{k}", v)
        else:
            w.add_float32(f"{arch}.{k}", v)
    w.add_vocab_size(vocab)
    w.add_file_type(0 if a.f32 else 15)       # LLAMA_FTYPE_MOSTLY_Q4_K_M
    add_tokenizer(w, tokens, types, merges, h["template"])

    embd_scale = h["extra"].get("embedding_scale", 1.0)
    put("token_embd.weight", rng.standard_normal((vocab, D), dtype=np.float32) * np.float32(0.5 / embd_scale), "q4k")
    w.add_tensor("output_norm.weight", norm_w(D))
    if not h["tied"]:
        put("output.weight", mat(vocab, D, scale=4.0), "q6k")
    for L in range(h["layers"] + h["nextn"]):
        p = f"blk.{L}."
        w.add_tensor(p + "attn_norm.weight", norm_w(D))
        put(p + "attn_q.weight", mat(H * HD, D), "q4k")
        put(p + "attn_k.weight", mat(KVH * HD, D), "q4k")
        put(p + "attn_v.weight", mat(KVH * HDV, D), "q6k")
        put(p + "attn_output.weight", mat(D, H * HDV, scale=0.5), "q4k")
        if h["bias"]:
            for nm, n in (("attn_q.bias", H * HD), ("attn_k.bias", KVH * HD), ("attn_v.bias", KVH * HDV)):
                w.add_tensor(p + nm, (0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32))
        if h["qk_norm"] == "head":
            w.add_tensor(p + "attn_q_norm.weight", norm_w(HD))
            w.add_tensor(p + "attn_k_norm.weight", norm_w(HD))
        elif h["qk_norm"] == "full":
            w.add_tensor(p + "attn_q_norm.weight", norm_w(H * HD))
            w.add_tensor(p + "attn_k_norm.weight", norm_w(KVH * HD))
        # GLM's GGUF names the FFN's pre-norm post_attention_norm (llama.cpp's glm4moe loader)
        w.add_tensor(p + ("post_attention_norm.weight" if arch == "glm4moe" else "ffn_norm.weight"), norm_w(D))
        if L < h["dense_lead"]:
            F = h["d_ff"]
            put(p + "ffn_gate.weight", mat(F, D), "q4k")
            put(p + "ffn_up.weight", mat(F, D), "q4k")
            put(p + "ffn_down.weight", mat(D, F, scale=0.5), "q6k")
            continue
        router = mat(E, D, scale=4.0)
        if a.random_types is not None:
            put(p + "ffn_gate_inp.weight", router, "q4k", drawn=drawn_type(a.random_types, p + "ffn_gate_inp", D, True))
        else:
            w.add_tensor(p + "ffn_gate_inp.weight", router)
        if arch == "glm4moe":
            w.add_tensor(p + "exp_probs_b.bias", (0.05 * rng.standard_normal(E, dtype=np.float32)).astype(np.float32))
        gate, up, down = mat(E, X, D), mat(E, X, D), mat(E, D, X, scale=0.5)
        if a.split_experts:     # the same values, one tensor per expert (gate 0..E-1, then up, then down)
            for nm, arr, kind in (("ffn_gate", gate, "q4k"), ("ffn_up", up, "q4k"), ("ffn_down", down, "down")):
                for e in range(E):
                    put(p + f"{nm}.{e}.weight", arr[e], kind)
        elif a.fuse_gate_up:    # the same values: each expert's gate rows, then its up rows (row-wise blocks)
            put(p + "ffn_gate_up_exps.weight", np.concatenate([gate, up], axis=1), "q4k")
            put(p + "ffn_down_exps.weight", down, "down")
        else:
            put(p + "ffn_gate_exps.weight", gate, "q4k")
            put(p + "ffn_up_exps.weight", up, "q4k")
            put(p + "ffn_down_exps.weight", down, "down")
        if h["shexp"]:
            S = h["shexp"]
            put(p + "ffn_gate_shexp.weight", mat(S, D), "q4k")
            put(p + "ffn_up_shexp.weight", mat(S, D), "q4k")
            put(p + "ffn_down_shexp.weight", mat(D, S, scale=0.5), "q6k")
            if h["shexp_gate"]:
                w.add_tensor(p + "ffn_gate_inp_shexp.weight", mat(D, scale=2.0))
        if L >= h["layers"]:                 # the MTP block's own tensors (unused by the forward;
            w.add_tensor(p + "nextn.eh_proj.weight", mat(D, 2 * D))   # llama.cpp's loader wants all six)
            w.add_tensor(p + "nextn.enorm.weight", norm_w(D))
            w.add_tensor(p + "nextn.hnorm.weight", norm_w(D))
            put(p + "nextn.embed_tokens.weight", mat(vocab, D), "q4k")
            put(p + "nextn.shared_head_head.weight", mat(vocab, D), "q6k")
            w.add_tensor(p + "nextn.shared_head_norm.weight", norm_w(D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
