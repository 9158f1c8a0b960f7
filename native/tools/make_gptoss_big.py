#!/usr/bin/env python3
"""make_gptoss_big.py — random-weight GGUFs with the full shapes of gpt-oss-20b and gpt-oss-120b,
written tensor by tensor in minutes, never held in RAM.

    make_gptoss_big.py OUT.gguf --shape 20b|120b [--profile uniform|realistic] [--seed 0]
                       [--attn-type q8_0|bf16] [--layers N] [--experts N] [-q]

Shape (arch gpt-oss, as llama.cpp's loader prints the ggml-org files): d_model 2880, 64 query heads
and 8 KV heads of 64, experts of width 2880 (expert_feed_forward_length) top-4, 20b: 24 layers x 32
experts, 120b: 36 layers x 128 experts; attention.sliding_window 128 on llama.cpp's period-2 layers;
YaRN RoPE freq_base 150000, factor 32, original context 4096; RMS eps 1e-5; context 131072; untied
head; vocabulary 201,088.
Tensors and types, as the ggml-org MXFP4 releases (llama.cpp's load log of gpt-oss-20b-mxfp4.gguf:
f32 289, q8_0 98, mxfp4 72, file type 38 MOSTLY_MXFP4_MOE, 11.27 GiB; the 120b's 59.02 GiB):
ffn_{gate,up,down}_exps MXFP4 with their per-expert F32 .bias; token_embd, output and attn_q/k/v/
output Q8_0 (or BF16 with --attn-type bf16: the q/k/v/output matrices only); norms, attn_sinks,
the router ffn_gate_inp (weight and bias) and every bias F32. --layers and --experts shrink the
shape for tests (the 20b's token_embd and output alone are 1.2 GB).

No float is quantized: blocks are random codes with scales chosen for finite zero-mean values of a
target std (~1/sqrt(fan_in) for projections):
  MXFP4: x = e2m1(code) * 2^(e-128); the 32 codes uniform over the 16 e2m1 values (zero mean, std
         5.852 in units of the doubled table); the E8M0 byte e is floor or floor + 1 of the exact
         exponent with the probability that makes E[x^2] the target's square.
  Q8_0:  x = d * q with q uniform over -127..127 (0x80 mapped to 0: zero mean), d an fp16.
  BF16:  a float32 normal's upper 16 bits.
Biases are small, except up's: -1 (+ jitter), so that the SwiGLU's (up + 1) has zero mean and no
expert adds a token-independent vector to the residual (which would bias every later router).
The header, KV and tensor infos go through gguf's GGUFWriter (>= 0.19 for MXFP4), then each tensor
is streamed in ~16 MB chunks; peak RSS stays ~0.5 GB (the tokenizer's tables).

Tokenizer: a synthetic byte-level BPE vocabulary of the real size: ids 0..255 the byte characters
(GPT-2 order, "!" first as in o200k), then every byte pair and byte triples as merges up to id
199,997; harmony's special tokens at their o200k_harmony ids 199,998..200,018 (control), and
[PAD200019].. [PAD201087] unused, as convert_hf_to_gguf pads; model gpt2, pre gpt-4o, bos
<|startoftext|>, eos <|return|>, padding <|endoftext|>. Chat template: gpt-oss's own, read from
llama.cpp's tree at $LLAMA_CPP_SRC/models/templates/openai-gpt-oss-120b.jinja when writing.

--profile (routing_profile.py): uniform (router rows of equal scale: nearly uniform expert use) or
realistic (each layer's hottest 12.5 / 25 / 50 % of experts take about 45 / 67 / 89 % of the picks).

Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from typing import BinaryIO
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, RopeScalingType

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_profile  # noqa: E402
from make_tiny_moe import bytes_to_unicode  # noqa: E402
from o200k_vocab import CONTROL, HARMONY_SPECIALS  # noqa: E402

Q = GGMLQuantizationType

ARCH = "gpt-oss"
D, HQ, HKV, HD, X, TOP_K = 2880, 64, 8, 64, 2880, 4
N_VOCAB, N_NORMAL = 201088, 199998
CTX, WINDOW, ROPE_BASE, YARN_FACTOR, YARN_ORIG, EPS = 131072, 128, 150000.0, 32.0, 4096, 1e-5
SHAPES = {"20b": (24, 32), "120b": (36, 128)}           # (layers, experts)
FILE_TYPE = 38                                           # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
UNUSED = 5
# o200k_harmony's specials 199998..200018 (ids after 200012 reserved, then <|endofprompt|>)
SPECIALS = HARMONY_SPECIALS + [f"<|reserved_{i}|>" for i in range(200013, 200018)] + ["<|endofprompt|>"]
TEMPLATE = "models/templates/openai-gpt-oss-120b.jinja"

EMB_STD = 1.0
ATTN_OUT_SCALE = 0.1        # std x sqrt(fan_in) of attn_output: small residual updates
GATE_UP_SCALE = 2.0         # gate/up pre-activations of std ~2: the clamp at 7 is reached now and then
DOWN_SCALE = 0.1            # expert outputs (activation std ~3) of std ~0.3 each
ROUTER_SCALE = 4.0          # router logit std (before the profile's row scales)
HEAD_SCALE = 4.0
CHUNK = 16 << 20
MXFP4_STD = 5.852           # std of the doubled e2m1 table over uniform codes: sqrt(274 / 8)
Q8_STD = math.sqrt(2 * sum(i * i for i in range(128)) / 256)     # q uniform over -127..127 and 0 twice


@dataclass
class Spec:
    """One tensor: name, GGML type, numpy shape in values (..., rows, cols), how to fill it."""
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    std: float = 0.0
    kind: str = "mat"                  # mat | vec (F32: mean + std * N(0,1)) | router
    mean: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)


def tensor_bytes(qt: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[qt]
    if shape[-1] % block:
        raise ValueError(f"row of {shape[-1]} values is not a multiple of {qt.name}'s block of {block}")
    return int(np.prod(shape[:-1])) * (shape[-1] // block) * size


def plan(layers: int, experts: int, attn_type: GGMLQuantizationType = Q.Q8_0) -> list[Spec]:
    """Every tensor of the file, in file order."""
    f32 = Q.F32
    out = [Spec("token_embd.weight", Q.Q8_0, (N_VOCAB, D), EMB_STD),
           Spec("output_norm.weight", f32, (D,), 0.1, "vec", 1.0),
           Spec("output.weight", Q.Q8_0, (N_VOCAB, D), HEAD_SCALE / math.sqrt(D))]
    for i in range(layers):
        p = f"blk.{i}."
        out += [
            Spec(p + "attn_norm.weight", f32, (D,), 0.1, "vec", 1.0),
            Spec(p + "attn_q.weight", attn_type, (HQ * HD, D), 1 / math.sqrt(D)),
            Spec(p + "attn_q.bias", f32, (HQ * HD,), 0.1, "vec"),
            Spec(p + "attn_k.weight", attn_type, (HKV * HD, D), 1 / math.sqrt(D)),
            Spec(p + "attn_k.bias", f32, (HKV * HD,), 0.1, "vec"),
            Spec(p + "attn_v.weight", attn_type, (HKV * HD, D), 1 / math.sqrt(D)),
            Spec(p + "attn_v.bias", f32, (HKV * HD,), 0.02, "vec"),
            Spec(p + "attn_output.weight", attn_type, (D, HQ * HD), ATTN_OUT_SCALE / math.sqrt(HQ * HD)),
            Spec(p + "attn_output.bias", f32, (D,), 0.01, "vec"),
            Spec(p + "attn_sinks.weight", f32, (HQ,), 1.0, "vec"),
            Spec(p + "post_attention_norm.weight", f32, (D,), 0.1, "vec", 1.0),
            Spec(p + "ffn_gate_inp.weight", f32, (experts, D), ROUTER_SCALE / math.sqrt(D), "router", extra={"layer": i}),
            Spec(p + "ffn_gate_inp.bias", f32, (experts,), 0.01, "vec"),
            Spec(p + "ffn_gate_exps.weight", Q.MXFP4, (experts, X, D), GATE_UP_SCALE / math.sqrt(D)),
            Spec(p + "ffn_gate_exps.bias", f32, (experts, X), 0.1, "vec"),
            Spec(p + "ffn_up_exps.weight", Q.MXFP4, (experts, X, D), GATE_UP_SCALE / math.sqrt(D)),
            Spec(p + "ffn_up_exps.bias", f32, (experts, X), 0.05, "vec", -1.0),
            Spec(p + "ffn_down_exps.weight", Q.MXFP4, (experts, D, X), DOWN_SCALE / math.sqrt(X)),
            Spec(p + "ffn_down_exps.bias", f32, (experts, D), 0.01, "vec"),
        ]
    return out


def byte_bpe(n_normal: int) -> tuple[list[str], list[str]]:
    """A synthetic byte-level BPE vocabulary of n_normal (> 65,792) ordinary tokens: ids 0..255 the
    byte characters in GPT-2's order ("!" first), then every byte pair, then byte triples, each a
    merge of its prefix and its last byte; returns (tokens, merges), one merge per multi-byte token."""
    chars = sorted(bytes_to_unicode().values())          # "!" .. then the remapped bytes
    tokens = list(chars)
    merges: list[str] = []
    for a in chars:
        for b in chars:
            tokens.append(a + b)
            merges.append(f"{a} {b}")
    pairs = tokens[256:]
    for pr in pairs:
        if len(tokens) >= n_normal:
            break
        for c in chars[: n_normal - len(tokens)]:
            tokens.append(pr + c)
            merges.append(f"{pr} {c}")
    assert len(tokens) == n_normal
    return tokens, merges


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    """The synthetic 201,088-token vocabulary (module docstring): tokens, GGUF types, merges."""
    tokens, merges = byte_bpe(N_NORMAL)
    types = [1] * N_NORMAL + [CONTROL] * len(SPECIALS)
    tokens += SPECIALS
    pads = range(len(tokens), N_VOCAB)
    tokens += [f"[PAD{i}]" for i in pads]
    types += [UNUSED] * len(pads)
    return tokens, types, merges


def chat_template(rel: str = TEMPLATE) -> str:
    """The text of llama.cpp's <rel> (a model's published chat template) in $LLAMA_CPP_SRC's tree."""
    src = Path(os.environ.get("LLAMA_CPP_SRC", Path.home() / ".cache/colibri/llama-cpp-python-0.3.36/vendor/llama.cpp"))
    path = src / rel
    if not path.exists():
        sys.exit(f"the chat template {path} is missing: source scripts/common.sh and run reference_up, "
                 "or set LLAMA_CPP_SRC to a llama.cpp tree")
    return path.read_text()


# ---- block fillers: blk is a [rows, blocks, bytes] uint8 array of random bytes ----
def mxfp4_exponent(std: float) -> tuple[int, int]:
    """(e, threshold): a block's E8M0 byte is e + 1 when its random byte < threshold, else e, so
    that E[scale^2] * MXFP4_STD^2 / 4 = std^2 (value = code * 2^(e-127) / 2)."""
    t = math.log2(2 * std / MXFP4_STD) + 127
    e = math.floor(t)
    q = (4 ** (t - e) - 1) / 3                           # P(e + 1): q 4^(e+1) + (1-q) 4^e = 4^t
    if not 1 <= e <= 253:
        raise ValueError(f"std {std} is outside MXFP4's exponent range")
    return e, int(round(q * 256))


def fill_mxfp4(blk: np.ndarray, std: float) -> None:
    e, thr = mxfp4_exponent(std)
    blk[..., 0] = np.where(blk[..., 0] < thr, e + 1, e).astype(np.uint8)


def fill_q8_0(blk: np.ndarray, std: float) -> None:
    q = blk[..., 2:]
    q[q == 0x80] = 0
    blk[..., 0:2] = np.array([std / Q8_STD], dtype=np.float16).view(np.uint8)


def f32_values(spec: Spec, rng: np.random.Generator, row_scales: np.ndarray | None) -> np.ndarray:
    arr = rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(spec.std) + np.float32(spec.mean)
    if row_scales is not None:
        arr *= row_scales.astype(np.float32)[:, None]
    return arr.astype(np.float32)


def stream_matrix(fout, spec: Spec, rng: np.random.Generator) -> None:
    rows, cols = int(np.prod(spec.shape[:-1])), spec.shape[-1]
    if spec.qtype == Q.BF16:
        per = max(1, CHUNK // (2 * cols))
        for r0 in range(0, rows, per):
            n = min(per, rows - r0)
            x = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(spec.std)
            fout.write((x.view(np.uint32) >> 16).astype(np.uint16).data)
        return
    block, size = GGML_QUANT_SIZES[spec.qtype]
    nb = cols // block
    fill = fill_mxfp4 if spec.qtype == Q.MXFP4 else fill_q8_0
    per = max(1, CHUNK // (nb * size))
    for r0 in range(0, rows, per):
        n = min(per, rows - r0)
        blk = rng.integers(0, 256, (n, nb, size), dtype=np.uint8)
        fill(blk, spec.std)
        fout.write(blk.data)


def write_header(w: GGUFWriter, specs: list[Spec]) -> BinaryIO:
    """Declares every tensor of the plan (its type and byte size, no data yet), writes the header,
    the keys and the tensor infos, and returns the open file positioned at the data's start: the
    tensors are then streamed one by one in plan order, each followed by its padding."""
    for s in specs:
        nb = tensor_bytes(s.qtype, s.shape)
        if s.qtype == Q.F32:
            w.add_tensor_info(s.name, s.shape, np.dtype(np.float32), nb)
        else:
            block, size = GGML_QUANT_SIZES[s.qtype]
            w.add_tensor_info(s.name, (*s.shape[:-1], s.shape[-1] // block * size), np.dtype(np.uint8), nb,
                              raw_dtype=s.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    fout = w.fout[0]
    w.write_padding(fout, fout.tell())
    return fout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--profile", choices=routing_profile.PROFILES, default="uniform",
                    help="expert routing: uniform, or realistic (hottest 12.5/25/50%% of a layer's experts take "
                         "~45/67/89%% of the picks; routing_profile.py)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn-type", choices=["q8_0", "bf16"], default="q8_0",
                    help="type of attn_q/k/v/output (q8_0: as the ggml-org releases)")
    ap.add_argument("--layers", type=int, help="override the shape's layer count (tests)")
    ap.add_argument("--experts", type=int, help="override the shape's expert count (tests; >= 5)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if not hasattr(Q, "MXFP4"):
        ap.error("gguf >= 0.19 is needed (MXFP4, type 39); this gguf has no MXFP4")
    layers, experts = SHAPES[a.shape]
    layers = a.layers if a.layers is not None else layers
    experts = a.experts if a.experts is not None else experts
    if layers < 1:
        ap.error("--layers must be >= 1")
    if experts <= TOP_K:
        ap.error(f"--experts must be > top-k {TOP_K}")
    t0 = time.time()
    specs = plan(layers, experts, Q.BF16 if a.attn_type == "bf16" else Q.Q8_0)
    tokens, types, merges = build_vocab()

    w = GGUFWriter(a.out, ARCH)
    w.add_name(f"gpt-oss-{a.shape}-shape-L{layers}-E{experts}-{a.profile}-seed{a.seed}")
    w.add_block_count(layers)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(X)
    w.add_head_count(HQ)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_expert_count(experts)
    w.add_expert_used_count(TOP_K)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_sliding_window(WINDOW)
    w.add_expert_feed_forward_length(X)
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN_FACTOR)
    w.add_rope_scaling_orig_ctx_len(YARN_ORIG)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|startoftext|>", N_NORMAL))
    w.add_eos_token_id(tokens.index("<|return|>", N_NORMAL))
    w.add_pad_token_id(tokens.index("<|endoftext|>", N_NORMAL))
    w.add_chat_template(chat_template())
    w.add_quantization_version(2)
    w.add_file_type(FILE_TYPE)
    del tokens, types, merges
    fout = write_header(w, specs)

    total = 0
    for ti, s in enumerate(specs):
        rng = np.random.default_rng([a.seed, 1, ti])
        nb = tensor_bytes(s.qtype, s.shape)
        if s.qtype == Q.F32:
            scales = None
            if s.kind == "router":
                scales = routing_profile.row_scales(a.profile, experts, TOP_K,
                                                    np.random.default_rng([a.seed, 7, s.extra["layer"]]))
            arr = f32_values(s, rng, scales)
            assert arr.nbytes == nb
            arr.tofile(fout)
        else:
            stream_matrix(fout, s, rng)
        w.write_padding(fout, nb, w.data_alignment)
        total += nb
        if not a.quiet and (ti % 38 == 2 or ti == len(specs) - 1):
            print(f"  {ti + 1}/{len(specs)} tensors, {total / 2**30:.2f} GiB, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    fout.flush()
    w.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wrote {a.out}: gpt-oss {a.shape} shape, {layers} layers x {experts} experts, profile {a.profile}, "
          f"{total / 2**30:.2f} GiB of tensor data, {len(specs)} tensors, {time.time() - t0:.1f} s, "
          f"peak RSS {rss:.0f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
