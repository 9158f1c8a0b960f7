#!/usr/bin/env python3
"""make_qwen35moe_big.py — a random-weight GGUF with the full shapes of Qwen3.6-35B-A3B (= Qwen3.5-35B-A3B)
at Q4_K_M, llama.cpp's `qwen35moe` layout, written tensor by tensor in minutes, never held in RAM.

    make_qwen35moe_big.py OUT.gguf [--profile uniform|realistic] [--layers N] [--seed 0] [-q]

Shape (the model's config.json text_config, as Qwen/Qwen3.5-35B-A3B publishes it and the Hugging Face
transformers docs describe Qwen3.6-35B-A3B: "Qwen3.6 checkpoints share the same architecture and
model_type as Qwen3.5"): d_model 2048; 40 layers, full_attention_interval 4 (layers 3, 7, .., 39 gated
full attention, the other 30 Gated DeltaNet); attention 16 query heads / 2 KV heads of head_dim 256
(attn_output_gate: attn_q is per head [q | gate]), per-head q/k RMS norms, partial_rotary_factor 0.25
(64 rotary dims), rope_theta 1e7, mrope_section [11, 11, 10]; linear attention (Gated DeltaNet)
linear_num_key_heads 16 / linear_num_value_heads 32 of 128 (key and value head dim), conv kernel 4;
256 routed experts of moe_intermediate_size 512, top-8 (norm_topk_prob), one shared expert of 512
with its sigmoid gate; rms_norm_eps 1e-6; max_position_embeddings 262144; untied head; vocab_size
248,320; mtp_num_hidden_layers 1.
GGUF keys and values as llama.cpp's load logs print them for the released files (unsloth's
Qwen3.6-35B-A3B GGUFs in llama.cpp PRs 22673 and 23269): block_count 41 (the 40 layers and the MTP
block), rope.dimension_sections [11, 11, 10, 0], rope.dimension_count 64, ssm.conv_kernel 4,
ssm.state_size 128, ssm.group_count 16, ssm.time_step_rank 32, ssm.inner_size 4096,
expert_feed_forward_length 512, expert_shared_feed_forward_length 512, nextn_predict_layers 1;
tokenizer gpt2 with 248,320 tokens, eos 248046 (<|im_end|>), padding 248055.
Tensor names and shapes: llama.cpp's src/models/qwen35moe.cpp (load_arch_tensors): per layer
attn_norm, post_attention_norm; DeltaNet layers attn_qkv [2048 -> 2 x 16 x 128 + 32 x 128 = 8192],
attn_gate [-> 4096], ssm_conv1d [4, 8192], ssm_dt.bias [32], ssm_a [32], ssm_beta / ssm_alpha
[2048 -> 32], ssm_norm [128], ssm_out [4096 -> 2048]; attention layers attn_q [2048 -> 2 x 16 x 256],
attn_k / attn_v [-> 512], attn_output [4096 -> 2048], attn_q_norm / attn_k_norm [256]; every layer
ffn_gate_inp [2048 -> 256], ffn_gate_exps / ffn_up_exps [2048 -> 512, 256], ffn_down_exps
[512 -> 2048, 256], ffn_gate_inp_shexp [2048], ffn_{gate,up}_shexp [2048 -> 512], ffn_down_shexp;
the MTP block (blk.40) an attention layer with its MoE plus nextn.eh_proj [4096 -> 2048] and
nextn.enorm / hnorm / shared_head_norm (it shares token_embd and output). --layers N writes N layers
of the same widths (the attention layers still every 4th) and the MTP block after them (blk.N).

Types: llama.cpp's Q4_K_M rules (src/llama-quant.cpp), as plain llama-quantize gives them for this
file (n_layer_all 41; each layer has one attn_v-like tensor, attn_qkv or attn_v, so its counter is the
layer index): attn_qkv, attn_v, ffn_down_exps and ffn_down_shexp Q6_K on use_more_bits layers (the
first and last eighth and every third between: 21 of the 41) else Q4_K — ffn_down so mixed because
that is Q4_K_M's rule for downs, and the common Q4_K_M files are llama-quantize's; every other
matrix Q4_K (attn_q / attn_k / attn_output, attn_gate, ssm_beta, ssm_alpha, ssm_out, the experts'
gate and up, the shared expert, nextn.eh_proj), token_embd Q4_K, output Q6_K; F32 what llama-quantize
leaves: norms, ssm_conv1d, ssm_dt, ssm_a, the routers ffn_gate_inp and the 1-D ffn_gate_inp_shexp.
Full file: 753 tensors (F32 310, Q4_K 379, Q6_K 64; the 733 and 301 F32 of the MTP-less releases'
load logs, plus the MTP block's 20), 21,702,472,192 bytes (20.21 GiB) of tensor data; a decoded
token reads ~1.98 GB of it: 0.61 GB of routed experts (8 of 256 in each of the 40 layers) and
1.37 GB of the rest (the Q6_K head 0.42 GB, DeltaNet and attention, shared experts, routers).

Weights are random (no float is quantized): Q4_K / Q6_K blocks of random codes with scales set for
finite, zero-mean values of a target std (make_qwen3moe_30b.py's Q4K / Q6K), ~1/sqrt(fan_in) for
projections, output projections (attn_output, ssm_out, the downs) smaller so that the residual stream
stays dominated by the embedding; F32 norms 1 + 0.1 N(0, 1); ssm_a = -exp(U(0, log 16)) (Qwen3-Next's
A_log initialisation), ssm_dt.bias N(0, 0.5), ssm_conv1d N(0, 0.75). No bias channel.

Tokenizer: make_gptoss_big.byte_bpe's synthetic byte-level BPE vocabulary, 248,044 ordinary tokens
(ids 0..255 the bytes, then byte pairs and triples, 247,788 merges: one per multi-byte token; the
real file has 247,587), then Qwen's special tokens at their ids (<|endoftext|> 248044, <|im_start|>
248045, <|im_end|> 248046, .. <|vision_pad|> 248055, <|image_pad|> 248056, .. <|file_sep|> 248065,
<tool_response> .. </think> 248066..248069), [PAD248070].. [PAD248319] unused; bos 248044 (not
added), eos 248046, padding 248055. tokenizer.ggml.pre "qwen2", not the release's "qwen35": the
engine does not know qwen35's pre-tokenizer (it would warn and use GPT-2's pattern), and qwen2's is
the nearest it runs. Chat template: llama.cpp's models/templates/Qwen3.5-4B.jinja (the Qwen3.5
family's), read from $LLAMA_CPP_SRC when writing.

--profile (routing_profile.py): uniform (router rows of equal scale) or realistic (each layer's
hottest 12.5 / 25 / 50 % of experts take about 45 / 67 / 89 % of the picks; (256, 8)'s fitted row
scales).

The header, KV and tensor infos go through gguf's GGUFWriter, then each tensor is streamed in ~16 MB
chunks: peak RSS ~120 MB whatever --layers (the full file in ~105 s on a loaded 2-core box, a
--layers 4 one, 3.2 GB, in ~25 s). Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import routing_profile  # noqa: E402
from make_arch_fixture import use_more_bits  # noqa: E402
from make_gptoss_big import CHUNK, Spec, byte_bpe, chat_template, f32_values, tensor_bytes, write_header  # noqa: E402
from make_qwen3moe_30b import Q4K, Q6K  # noqa: E402

Q = GGMLQuantizationType

ARCH = "qwen35moe"
D, LAYERS, INTERVAL, NEXTN = 2048, 40, 4, 1
HQ, HKV, HD, ROPE_DIM, SECTIONS, ROPE_BASE = 16, 2, 256, 64, [11, 11, 10, 0], 1e7
D_CONV, SSM_S, SSM_HK, SSM_HV = 4, 128, 16, 32          # conv kernel, head width, q/k heads, v heads
N_EXP, TOP_K, D_EXP, D_SHEXP = 256, 8, 512, 512
EPS, CTX = 1e-6, 262144
N_VOCAB, N_NORMAL = 248320, 248044
FILE_TYPE = 15                                           # LLAMA_FTYPE_MOSTLY_Q4_K_M
CONTROL, USER, UNUSED = 3, 4, 5
# Qwen's added tokens from 248044 on (Qwen2.5 / Qwen3's order; "special": false ones user-defined)
SPECIALS = [(t, CONTROL) for t in (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>")] + [("<tool_call>", USER), ("</tool_call>", USER)] + [(t, CONTROL) for t in (
    "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")] + [
    (t, USER) for t in ("<tool_response>", "</tool_response>", "<think>", "</think>")]
BOS, EOS, PAD = 248044, 248046, 248055
TEMPLATE = "models/templates/Qwen3.5-4B.jinja"

EMB_STD = 1.0
OUT_SCALE = 0.1             # attn_output / ssm_out std x sqrt(fan_in): small residual updates
DOWN_SCALE = 0.3            # routed and shared downs
ROUTER_SCALE = 4.0          # router logit std (before the profile's row scales)
HEAD_SCALE = 4.0


def is_attention(layer: int, layers: int) -> bool:
    """Full attention at every INTERVAL-th trunk layer and in the MTP block (blk.<layers>)."""
    return layer >= layers or (layer + 1) % INTERVAL == 0


def plan(layers: int = LAYERS) -> list[Spec]:
    """Every tensor of the file, in file order, with its Q4_K_M type."""
    f32 = Q.F32
    n_all = layers + NEXTN

    def more(i: int) -> GGMLQuantizationType:
        return Q.Q6_K if use_more_bits(i, n_all) else Q.Q4_K

    out = [Spec("token_embd.weight", Q.Q4_K, (N_VOCAB, D), EMB_STD),
           Spec("output_norm.weight", f32, (D,), 0.1, "vec", 1.0),
           Spec("output.weight", Q.Q6_K, (N_VOCAB, D), HEAD_SCALE / math.sqrt(D))]
    sd, vd = 1 / math.sqrt(D), SSM_HV * SSM_S
    ch = 2 * SSM_HK * SSM_S + vd
    for i in range(n_all):
        p = f"blk.{i}."
        out += [Spec(p + "attn_norm.weight", f32, (D,), 0.1, "vec", 1.0),
                Spec(p + "post_attention_norm.weight", f32, (D,), 0.1, "vec", 1.0)]
        if is_attention(i, layers):
            out += [
                Spec(p + "attn_q.weight", Q.Q4_K, (2 * HQ * HD, D), sd),
                Spec(p + "attn_k.weight", Q.Q4_K, (HKV * HD, D), sd),
                Spec(p + "attn_v.weight", more(i), (HKV * HD, D), sd),
                Spec(p + "attn_output.weight", Q.Q4_K, (D, HQ * HD), OUT_SCALE / math.sqrt(HQ * HD)),
                Spec(p + "attn_q_norm.weight", f32, (HD,), 0.1, "vec", 1.0),
                Spec(p + "attn_k_norm.weight", f32, (HD,), 0.1, "vec", 1.0),
            ]
        else:
            out += [
                Spec(p + "attn_qkv.weight", more(i), (ch, D), sd),
                Spec(p + "attn_gate.weight", Q.Q4_K, (vd, D), sd),
                Spec(p + "ssm_conv1d.weight", f32, (ch, D_CONV), 0.75, "vec"),
                Spec(p + "ssm_dt.bias", f32, (SSM_HV,), 0.5, "vec"),
                Spec(p + "ssm_a", f32, (SSM_HV,), kind="ssm_a"),
                Spec(p + "ssm_beta.weight", Q.Q4_K, (SSM_HV, D), 2 * sd),
                Spec(p + "ssm_alpha.weight", Q.Q4_K, (SSM_HV, D), 2 * sd),
                Spec(p + "ssm_norm.weight", f32, (SSM_S,), 0.1, "vec", 1.0),
                Spec(p + "ssm_out.weight", Q.Q4_K, (D, vd), OUT_SCALE / math.sqrt(vd)),
            ]
        out += [
            Spec(p + "ffn_gate_inp.weight", f32, (N_EXP, D), ROUTER_SCALE * sd, "router", extra={"layer": i}),
            Spec(p + "ffn_gate_exps.weight", Q.Q4_K, (N_EXP, D_EXP, D), sd),
            Spec(p + "ffn_up_exps.weight", Q.Q4_K, (N_EXP, D_EXP, D), sd),
            Spec(p + "ffn_down_exps.weight", more(i), (N_EXP, D, D_EXP), DOWN_SCALE / math.sqrt(D_EXP)),
            Spec(p + "ffn_gate_inp_shexp.weight", f32, (D,), sd, "vec"),
            Spec(p + "ffn_gate_shexp.weight", Q.Q4_K, (D_SHEXP, D), sd),
            Spec(p + "ffn_up_shexp.weight", Q.Q4_K, (D_SHEXP, D), sd),
            Spec(p + "ffn_down_shexp.weight", more(i), (D, D_SHEXP), DOWN_SCALE / math.sqrt(D_SHEXP)),
        ]
        if i >= layers:
            out += [Spec(p + "nextn.eh_proj.weight", Q.Q4_K, (D, 2 * D), 1 / math.sqrt(2 * D)),
                    Spec(p + "nextn.enorm.weight", f32, (D,), 0.1, "vec", 1.0),
                    Spec(p + "nextn.hnorm.weight", f32, (D,), 0.1, "vec", 1.0),
                    Spec(p + "nextn.shared_head_norm.weight", f32, (D,), 0.1, "vec", 1.0)]
    return out


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    """The synthetic 248,320-token vocabulary (module docstring): tokens, GGUF types, merges."""
    tokens, merges = byte_bpe(N_NORMAL)
    types = [1] * N_NORMAL
    for t, ty in SPECIALS:
        tokens.append(t)
        types.append(ty)
    pads = range(len(tokens), N_VOCAB)
    tokens += [f"[PAD{i}]" for i in pads]
    types += [UNUSED] * len(pads)
    return tokens, types, merges


def stream_kquant(fout, spec: Spec, rng: np.random.Generator, table_rng: np.random.Generator) -> None:
    """Q4_K / Q6_K rows of random codes whose scales give values of spec.std, in ~CHUNK pieces."""
    block, size = GGML_QUANT_SIZES[spec.qtype]
    gen = (Q4K if spec.qtype == Q.Q4_K else Q6K)(table_rng, spec.std)
    rows, nb = int(np.prod(spec.shape[:-1])), spec.shape[-1] // block
    per = max(1, CHUNK // (nb * size))
    for r0 in range(0, rows, per):
        blk = rng.integers(0, 256, (min(per, rows - r0), nb, size), dtype=np.uint8)
        gen.fill(rng, blk)
        fout.write(blk.data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--profile", choices=routing_profile.PROFILES, default="uniform",
                    help="expert routing: uniform, or realistic (hottest 12.5/25/50%% of a layer's experts take "
                         "~45/67/89%% of the picks; routing_profile.py)")
    ap.add_argument("--layers", type=int, default=LAYERS, help="trunk layers (the MTP block follows them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.layers < 1:
        ap.error("--layers must be >= 1")
    t0 = time.time()
    specs = plan(a.layers)
    template = chat_template(TEMPLATE)
    tokens, types, merges = build_vocab()

    w = GGUFWriter(a.out, ARCH)
    w.add_name(f"qwen3.6-35b-a3b-shape-L{a.layers}-{a.profile}-seed{a.seed}")
    w.add_block_count(a.layers + NEXTN)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_head_count(HQ)
    w.add_head_count_kv(HKV)
    w.add_array(f"{ARCH}.rope.dimension_sections", SECTIONS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_expert_count(N_EXP)
    w.add_expert_used_count(TOP_K)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_expert_feed_forward_length(D_EXP)
    w.add_uint32(f"{ARCH}.expert_shared_feed_forward_length", D_SHEXP)
    w.add_uint32(f"{ARCH}.ssm.conv_kernel", D_CONV)
    w.add_uint32(f"{ARCH}.ssm.state_size", SSM_S)
    w.add_uint32(f"{ARCH}.ssm.group_count", SSM_HK)
    w.add_uint32(f"{ARCH}.ssm.time_step_rank", SSM_HV)
    w.add_uint32(f"{ARCH}.ssm.inner_size", SSM_HV * SSM_S)
    w.add_uint32(f"{ARCH}.full_attention_interval", INTERVAL)
    w.add_rope_dimension_count(ROPE_DIM)
    w.add_uint32(f"{ARCH}.nextn_predict_layers", NEXTN)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS)
    w.add_eos_token_id(EOS)
    w.add_pad_token_id(PAD)
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    w.add_quantization_version(2)
    w.add_file_type(FILE_TYPE)
    del tokens, types, merges
    fout = write_header(w, specs)

    total = 0
    for ti, s in enumerate(specs):
        rng = np.random.default_rng([a.seed, 1, ti])
        nb = tensor_bytes(s.qtype, s.shape)
        if s.kind == "ssm_a":              # -exp(A_log), A_log ~ U(0, log 16)
            arr = (-np.exp(rng.uniform(0.0, math.log(16.0), s.shape))).astype(np.float32)
        elif s.qtype == Q.F32:
            scales = None
            if s.kind == "router":
                scales = routing_profile.row_scales(a.profile, N_EXP, TOP_K,
                                                    np.random.default_rng([a.seed, 7, s.extra["layer"]]))
            arr = f32_values(s, rng, scales)
        else:
            stream_kquant(fout, s, rng, np.random.default_rng([a.seed, 2, ti]))
            arr = None
        if arr is not None:
            assert arr.nbytes == nb
            arr.tofile(fout)
        w.write_padding(fout, nb, w.data_alignment)
        total += nb
        if not a.quiet and (ti % 60 == 2 or ti == len(specs) - 1):
            print(f"  {ti + 1}/{len(specs)} tensors, {total / 2**30:.2f} GiB, {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    fout.flush()
    w.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wrote {a.out}: qwen35moe 35B-A3B shape, {a.layers} layers + MTP, profile {a.profile}, "
          f"{total / 2**30:.2f} GiB of tensor data, {len(specs)} tensors, {time.time() - t0:.1f} s, "
          f"peak RSS {rss:.0f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
