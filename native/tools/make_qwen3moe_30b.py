#!/usr/bin/env python3
"""make_qwen3moe_30b.py — a random-weight GGUF with the shapes of Qwen3-30B-A3B at Q4_K_M (issue 23 item 2).

    make_qwen3moe_30b.py OUT.gguf [--layers 48] [--seed 0] [--profile uniform|realistic | --skew ALPHA]

Shape (Qwen3-30B-A3B's config): arch qwen3moe, 48 layers, d_model 2048, 32 query heads / 4 KV heads
of head_dim 128 (q/k RMSNorm per head), 128 experts of width 768, top-8 renormalised, NeoX RoPE base
1e6, RMS eps 1e-6, untied output head, vocabulary 151,936 (a synthetic byte-level BPE vocabulary:
make_tiny_moe.py's 459 tokens and 200 merges, then every byte pair and byte triples as further
merges, until 151,936 tokens; tokenizer gpt2 / pre qwen2, ChatML template).

Types: llama.cpp's Q4_K_M rules for this shape (src/llama-quant.cpp; 128 experts, so no 8-expert
bumps): token_embd Q4_K, output Q6_K, attn_q / attn_k / attn_output Q4_K, attn_v and ffn_down_exps
Q6_K on use_more_bits layers (first and last eighth, every third between) else Q4_K,
ffn_gate_exps / ffn_up_exps Q4_K; norms, q/k norms and the router ffn_gate_inp F32.
--layers 24 gives the half-depth sibling (~9 GB), --layers 2..4 the small ones tests use.

Weights are not quantized from floats (too slow for 17 GiB): each K-quant block's code bytes are
random and its fp16 scale fields are set so that values are finite, zero-mean and of a chosen
standard deviation (~1/sqrt(fan_in) for projections):
  Q4_K: x = d·sc·q − dmin·m with q uniform in 0..15; d a power of two, dmin = 15·d, per sub-block
        an even sc (jittered around the mean that gives the target std) and m = sc/2, so every
        sub-block's mean d·sc·7.5 − 15·d·sc/2 is exactly 0.
  Q6_K: x = d·sc·(q − 32) with q uniform in 0..63 (mean −0.5); the int8 scales get random signs,
        so the rows' means cancel (zero in expectation).
The file is written tensor by tensor in chunks of ~16 MB (header, KV and tensor infos through
gguf's GGUFWriter, then the data streamed): peak RSS stays at a few hundred MB whatever --layers.

A constant "bias channel": in every token embedding the first 64 dimensions (sub-blocks 0 and 1 of
its first Q4_K super-block, sc = 0, m = 63) hold the same value C = −dmin·63, and the rows 0..63 of
every attn_output and ffn_down_exps are zero (d = dmin = 0), so those dimensions of the residual
stream stay C through all layers (real models have such "massive activation" dimensions), and the
input columns 0..63 of attn_q / attn_k / attn_v / ffn_gate_exps / ffn_up_exps are zero too (sub-blocks
with sc = m = 0, Q6_K group scales 0), so no layer turns the constant into a token-independent
component of the residual (which, summed over 48 layers, would skew the uniform file's deep
routers: 0.33 -> 0.47 top-quarter share from layer 0 to 47 before this). The router's columns 0..63 read it: zero in the uniform file (routing from the random hidden state
alone), and with --skew they carry a per-expert bias b_e, so that for every token the logit of
expert e moves by ~b_e.

--skew ALPHA: per layer a random ranking of the 128 experts and a target popularity
p(rank) ∝ (rank + 1)^−ALPHA (Zipf). ALPHA 0.55 puts ~half of the picks on the top quarter of
experts (the issue's measured case: "a quarter of each layer's experts take about half the
picks"); the biases are solved numerically for top-8 selection under Gaussian router noise of the
file's scale (an estimate: the engine's usage counts give what the real hidden states do).

--profile realistic (routing_profile.py): each layer's router rows are scaled by (1 + rank/4)^-0.5
over a random ranking of its experts, so that the hottest 12.5 / 25 / 50 % take about 45 / 67 / 89 %
of the picks (as measured on a real 2026 MoE); it acts through each token's own hidden state, not
the bias channel (which stays zero). --skew is the older Zipf-bias alternative; they exclude each other.

Same arguments -> same bytes.
"""
from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_arch_fixture import QWEN3_TEMPLATE, add_tokenizer, use_more_bits  # noqa: E402
import routing_profile  # noqa: E402
from make_tiny_moe import build_vocab  # noqa: E402

N_VOCAB = 151936
D, HQ, HKV, HD = 2048, 32, 4, 128
N_EXP, TOP_K, D_EXP = 128, 8, 768
CTX = 40960
N_CH = 64                 # bias channel: dimensions 0..63
EMB_STD = 1.0             # token embedding values
OUT_SCALE_ATTN = 0.1      # attn_output std × sqrt(fan_in): small residual updates, so the
OUT_SCALE_DOWN = 0.3      # channel's share of the RMS-normalised state stays roughly constant
ROUTER_SCALE = 4.0        # router std × sqrt(fan_in) (make_arch_fixture's)
HEAD_SCALE = 4.0
CHUNK = 16 << 20
Q = GGMLQuantizationType
BLOCK_BYTES = {Q.Q4_K: 144, Q.Q6_K: 210}


def extend_vocab(n_total):
    """make_tiny_moe's vocabulary + byte pairs + byte triples as BPE merges, to n_total tokens."""
    tokens, types, merges = build_vocab()
    have = set(tokens)
    specials = [t for t, ty in zip(tokens, types) if ty != 1]
    chars = tokens[len(specials):len(specials) + 256]        # the 256 byte-level characters
    pairs = []
    for a in chars:
        for b in chars:
            if len(tokens) >= n_total:
                break
            t = a + b
            pairs.append(t)
            if t not in have:
                have.add(t)
                tokens.append(t)
                types.append(1)
                merges.append(f"{a} {b}")
    for p in pairs:
        for c in chars:
            if len(tokens) >= n_total:
                return tokens, types, merges
            t = p + c
            if t not in have:
                have.add(t)
                tokens.append(t)
                types.append(1)
                merges.append(f"{p} {c}")
    assert len(tokens) == n_total
    return tokens, types, merges


def f16_bytes(x):
    return np.array([x], dtype=np.float16).view(np.uint8)


class Q4K:
    """Random Q4_K rows of a given value std (module docstring)."""

    def __init__(self, rng, std):
        self.d = 2.0 ** math.ceil(math.log2(std / (60 * 4.6098)))      # std of q uniform 0..15: 4.6098
        sc_mean = std / (self.d * 4.6098)                               # in (30, 60]
        sc = np.clip(2 * np.rint((sc_mean + rng.uniform(-8, 8, size=(4096, 8))) / 2), 2, 62).astype(np.uint8)
        m = sc // 2
        s = np.zeros((4096, 12), dtype=np.uint8)
        s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
        s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
        s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
        self.table = s
        self.head = np.concatenate([f16_bytes(self.d), f16_bytes(15 * self.d)])
        self.const = -15 * self.d * 63                                  # value of a sub-block with sc 0, m 63

    def fill(self, rng, blk):            # blk: [..., 144] uint8, random bytes
        flat = blk.reshape(-1, 144)
        flat[:, 0:4] = self.head
        flat[:, 4:16] = self.table[rng.integers(0, 4096, len(flat))]


class Q6K:
    def __init__(self, rng, std):
        self.d = 2.0 ** math.ceil(math.log2(std / (100 * 18.4730)))     # std of q uniform 0..63: 18.473
        sc_mean = std / (self.d * 18.4730)                              # in (50, 100]
        mag = np.clip(np.rint(sc_mean + rng.uniform(-10, 10, size=(4096, 16))), 1, 127)
        sign = np.where(rng.random((4096, 16)) < 0.5, -1, 1)
        self.table = (mag * sign).astype(np.int8).view(np.uint8)
        self.head = f16_bytes(self.d)

    def fill(self, rng, blk):
        flat = blk.reshape(-1, 210)
        flat[:, 192:208] = self.table[rng.integers(0, 4096, len(flat))]
        flat[:, 208:210] = self.head


def zipf_biases(rng, alpha, noise_std, n=N_EXP, k=TOP_K, samples=8000, iters=60):
    """Per-expert logit biases b (random ranking) such that top-k of (N(0, noise_std²) + b) picks
    expert e with frequency ∝ (rank_e + 1)^-alpha; returns (b, the simulated top-quarter share)."""
    target = (np.arange(1, n + 1, dtype=np.float64)) ** -alpha
    target = target / target.sum() * k        # expected picks per token, sums to k
    target = np.minimum(target, 0.98)
    target *= k / target.sum()
    noise = rng.standard_normal((samples, n)) * noise_std
    b = np.zeros(n)
    for _ in range(iters):
        sel = np.argpartition(-(noise + b), k, axis=1)[:, :k]
        freq = np.bincount(sel.ravel(), minlength=n) / samples + 0.5 / samples
        b += 0.7 * noise_std * (np.log(target) - np.log(freq))
        b -= b.mean()
    sel = np.argpartition(-(noise + b), k, axis=1)[:, :k]
    freq = np.sort(np.bincount(sel.ravel(), minlength=n))[::-1]
    share = freq[: n // 4].sum() / freq.sum()
    perm = rng.permutation(n)                # rank r -> expert perm[r]
    out = np.empty(n)
    out[perm] = b
    return out.astype(np.float32), float(share)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skew", type=float, default=0.0, metavar="ALPHA",
                    help="Zipf exponent of each layer's expert popularity (0 = uniform; 0.55 ~ top quarter takes half)")
    ap.add_argument("--profile", choices=routing_profile.PROFILES, default="uniform",
                    help="expert routing: uniform, or realistic (hottest 12.5/25/50%% of a layer's experts take "
                         "~45/67/89%% of the picks; routing_profile.py)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.skew and a.profile != "uniform":
        ap.error("--skew and --profile realistic exclude each other")
    t_start = time.time()
    L = a.layers
    tokens, types, merges = extend_vocab(N_VOCAB)

    # ---- the plan: (name, ggml type, numpy shape of values, generator) ----
    def more(i):
        return use_more_bits(i, L)

    plan = []   # (name, qtype, shape (..., rows, cols) in values, kind, extra)
    plan.append(("token_embd.weight", Q.Q4_K, (N_VOCAB, D), "embd", {}))
    plan.append(("output_norm.weight", Q.F32, (D,), "norm", {}))
    plan.append(("output.weight", Q.Q6_K, (N_VOCAB, D), "mat", dict(std=HEAD_SCALE / math.sqrt(D))))
    for i in range(L):
        p = f"blk.{i}."
        v_t = Q.Q6_K if more(i) else Q.Q4_K
        plan += [
            (p + "attn_norm.weight", Q.F32, (D,), "norm", {}),
            (p + "attn_q.weight", Q.Q4_K, (HQ * HD, D), "mat", dict(std=1 / math.sqrt(D), zero_cols=True)),
            (p + "attn_k.weight", Q.Q4_K, (HKV * HD, D), "mat", dict(std=1 / math.sqrt(D), zero_cols=True)),
            (p + "attn_v.weight", v_t, (HKV * HD, D), "mat", dict(std=1 / math.sqrt(D), zero_cols=True)),
            (p + "attn_output.weight", Q.Q4_K, (D, HQ * HD), "mat",
             dict(std=OUT_SCALE_ATTN / math.sqrt(HQ * HD), zero_rows=N_CH)),
            (p + "attn_q_norm.weight", Q.F32, (HD,), "norm", {}),
            (p + "attn_k_norm.weight", Q.F32, (HD,), "norm", {}),
            (p + "ffn_norm.weight", Q.F32, (D,), "norm", {}),
            (p + "ffn_gate_inp.weight", Q.F32, (N_EXP, D), "router", dict(layer=i)),
            (p + "ffn_gate_exps.weight", Q.Q4_K, (N_EXP, D_EXP, D), "mat", dict(std=1 / math.sqrt(D), zero_cols=True)),
            (p + "ffn_up_exps.weight", Q.Q4_K, (N_EXP, D_EXP, D), "mat", dict(std=1 / math.sqrt(D), zero_cols=True)),
            (p + "ffn_down_exps.weight", Q.Q6_K if more(i) else Q.Q4_K, (N_EXP, D, D_EXP), "mat",
             dict(std=OUT_SCALE_DOWN / math.sqrt(D_EXP), zero_rows=N_CH)),
        ]

    def nbytes(qt, shape):
        if qt == Q.F32:
            return 4 * int(np.prod(shape))
        return int(np.prod(shape[:-1])) * shape[-1] // 256 * BLOCK_BYTES[qt]

    w = GGUFWriter(a.out, "qwen3moe")
    w.add_name(f"qwen3moe-30b-a3b-shape-L{L}" + (f"-skew{a.skew:g}" if a.skew else "")
               + (f"-{a.profile}" if a.profile != "uniform" else "") + f"-seed{a.seed}")
    w.add_block_count(L)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(6144)
    w.add_head_count(HQ)
    w.add_head_count_kv(HKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(N_EXP)
    w.add_expert_used_count(TOP_K)
    w.add_uint32("qwen3moe.expert_feed_forward_length", D_EXP)
    w.add_bool("qwen3moe.expert_weights_norm", True)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(15)                      # LLAMA_FTYPE_MOSTLY_Q4_K_M
    add_tokenizer(w, tokens, types, merges, QWEN3_TEMPLATE)
    del tokens, types, merges
    for name, qt, shape, _, _ in plan:
        nb = nbytes(qt, shape)
        if qt == Q.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nb)
        else:
            bshape = (*shape[:-1], shape[-1] // 256 * BLOCK_BYTES[qt])
            w.add_tensor_info(name, bshape, np.dtype(np.uint8), nb, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    align = w.data_alignment
    w.write_padding(fout, fout.tell())

    # router: random part over the non-channel dims; the channel columns carry the skew bias
    # The channel's value in the RMS-normalised FFN input: t_ch = C / rms(h). rms(h)^2 = (N_CH C^2 +
    # (D - N_CH) var_rest) / D, var_rest ~ EMB_STD^2 (1 + layer * growth): residual updates are small
    # by construction (OUT_SCALE_*); growth is a rough estimate per layer of the two sublayers' output
    # variance relative to the embedding's.
    emb_q = Q4K(np.random.default_rng([a.seed, 0, 1]), EMB_STD)
    C = emb_q.const
    growth = (OUT_SCALE_ATTN ** 2 * 0.5 + OUT_SCALE_DOWN ** 2 * 0.15) / EMB_STD ** 2
    rest_frac = (D - N_CH) / D
    noise_std = ROUTER_SCALE * math.sqrt(rest_frac)          # router logit std from the random part
    sim_shares = []

    def router(i, rng):
        W = (rng.standard_normal((N_EXP, D), dtype=np.float32) * np.float32(ROUTER_SCALE / math.sqrt(D)))
        W[:, :N_CH] = 0
        if a.profile != "uniform":
            W *= routing_profile.row_scales(a.profile, N_EXP, TOP_K, np.random.default_rng([a.seed, 8, i]))[:, None].astype(np.float32)
        if a.skew:
            var_rest = EMB_STD ** 2 * (1 + (i + 0.5) * growth)
            rms = math.sqrt((N_CH * C * C + (D - N_CH) * var_rest) / D)
            t_ch = C / rms                                    # per channel dimension (norm weight 1 there)
            b, share = zipf_biases(np.random.default_rng([a.seed, 7, i]), a.skew, noise_std * math.sqrt(var_rest) / rms)
            sim_shares.append(share)
            W[:, :N_CH] = (b / (N_CH * t_ch))[:, None].astype(np.float32)
        return W

    total = 0
    for ti, (name, qt, shape, kind, ex) in enumerate(plan):
        rng = np.random.default_rng([a.seed, 1, ti])
        nb = nbytes(qt, shape)
        if qt == Q.F32:
            if kind == "norm":
                arr = (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
                if shape[0] == D:
                    arr[:N_CH] = 1.0       # the channel passes the norms unscaled
            else:
                arr = router(ex["layer"], rng)
            assert arr.nbytes == nb
            arr.tofile(fout)
        else:
            bb = BLOCK_BYTES[qt]
            cols_b = shape[-1] // 256
            rows_total = int(np.prod(shape[:-1]))
            rows_per_matrix = shape[-2]
            gen = emb_q if kind == "embd" else (Q4K if qt == Q.Q4_K else Q6K)(np.random.default_rng([a.seed, 2, ti]), ex["std"])
            rows_chunk = max(1, CHUNK // (cols_b * bb))
            r0 = 0
            while r0 < rows_total:
                n = min(rows_chunk, rows_total - r0)
                blk = rng.integers(0, 256, (n, cols_b, bb), dtype=np.uint8)
                gen.fill(rng, blk)
                if kind == "embd":           # sub-blocks 0, 1 of super-block 0: sc 0, m 63 -> constant C
                    blk[:, 0, 4:6] &= 0xC0
                    blk[:, 0, 8:10] = (blk[:, 0, 8:10] & 0xC0) | 63
                if ex.get("zero_cols"):      # input columns 0..63 zero: only the routers read the channel
                    if qt == Q.Q4_K:         # sub-blocks 0, 1 of super-block 0: sc = m = 0
                        blk[:, 0, 4:6] &= 0xC0
                        blk[:, 0, 8:10] &= 0xC0
                    else:                    # Q6_K: the scales of its first four 16-value groups
                        blk[:, 0, 192:196] = 0
                zr = ex.get("zero_rows", 0)
                if zr:
                    rr = (r0 + np.arange(n)) % rows_per_matrix
                    z = rr < zr
                    if qt == Q.Q4_K:
                        blk[z, :, 0:4] = 0
                    else:
                        blk[z, :, 208:210] = 0
                fout.write(memoryview(blk).cast("B"))
                r0 += n
        w.write_padding(fout, nb, align)
        total += nb
        if not a.quiet and (ti % 24 == 0 or ti == len(plan) - 1):
            print(f"  {ti + 1}/{len(plan)} tensors, {total / 2**30:.2f} GiB, {time.time() - t_start:.0f} s",
                  file=sys.stderr, flush=True)
    fout.flush()
    w.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    msg = (f"wrote {a.out}: {L} layers, {total / 2**30:.2f} GiB of tensor data, {len(plan)} tensors, "
           f"{time.time() - t_start:.1f} s, peak RSS {rss:.0f} MB")
    if sim_shares:
        msg += (f"; skew {a.skew:g}: simulated top-quarter share {min(sim_shares):.3f}-{max(sim_shares):.3f}")
    print(msg, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
