#!/usr/bin/env python3
"""make_tiny_gptoss.py — seeded random-weight files in llama.cpp's `gpt-oss` layout (its
LLM_ARCH_OPENAI_MOE loader, src/models/openai-moe.cpp), gpt-oss-20b's structure scaled down.

    make_tiny_gptoss.py OUT.gguf [--seed 0] [--window 8] [--layers 4] [--mix f32|q4_k_m|...]
                        [--random-types SEED] [--tensor-type REGEX=TYPE]
    make_tiny_gptoss.py OUT.gguf --script SPEC.json    # a model whose greedy output is scripted

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

--script SPEC.json: not random weights but a construction whose every forward pass is the real
graph's, with an o200k-style vocabulary (o200k_vocab.py: harmony's specials are single control
tokens) and SPEC's chat template. SPEC = {"template": TEXT, "window": W, "exchanges":
[{"context": PROMPT_TAIL, "output": TEXT}, ...]}: after a prompt ending in PROMPT_TAIL the model
writes OUTPUT, token by token, by argmax with a margin of MARGIN logits (so sampling at any usual
temperature writes it too). How (scripted_weights): one layer, sliding window W, q = 0 so every
position attends uniformly to its last W tokens (sinks -30: no mass); each script token has its
own embedding axis (every other token one shared axis); v copies those axes and attn_output puts
the window's mean beside the current token's axis, so the residual holds (current token, bag of
the last W tokens); the experts' outputs are zero; the head is the least-squares solution that
maps each scripted step's features to MARGIN on its next token (exact when the features are
independent: checked, with the argmax of every step recomputed in float64).

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


MARGIN = 60.0      # logits between a scripted token and any other at its step
OTHER_AXIS = 127   # the embedding axis every token outside the script shares
SINK = -30.0       # the sinks' logit: no softmax mass


def _script_vocab(spec: dict[str, Any]) -> tuple[Any, Any]:
    """An o200k-style vocabulary trained over the template, the exchanges and pydoc's topics."""
    from pydoc_data.topics import topics

    import o200k_vocab
    texts = [spec["template"]] + [e["context"] + e["output"] for e in spec["exchanges"]]
    texts += [topics[k] for k in sorted(topics)][:60]
    tk = o200k_vocab.train(texts, vocab_size=int(spec.get("vocab_size", 1500)))
    return tk, o200k_vocab.vocab_of(tk)


def _steps(spec: dict[str, Any], tk: Any) -> list[tuple[list[int], int]]:
    """(the window's token ids, the next token) for every scripted step."""
    W = int(spec["window"])
    steps = []
    for e in spec["exchanges"]:
        ctx, out = tk.encode(e["context"]).ids, tk.encode(e["output"]).ids
        if len(ctx) < W:
            raise ValueError(f"context {e['context']!r} has {len(ctx)} tokens; the window {W} needs {W}")
        full = ctx[-W:] + out       # step i: the window full[i:i + W] ends at the token before out[i]
        steps += [(full[i:i + W], out[i]) for i in range(len(out))]
    return steps


def scripted_weights(spec: dict[str, Any], vocab: int, steps: list[tuple[list[int], int]]) -> dict[str, np.ndarray]:
    """The tensors of the construction in this module's docstring (one layer, SHAPE's widths)."""
    D, H, KVH, HD, E, X = (SHAPE[k] for k in ("d_model", "n_heads", "n_kv", "head_dim", "experts", "d_expert"))
    axes = sorted({t for win, nxt in steps for t in [*win, nxt]})
    if len(axes) > OTHER_AXIS:
        raise ValueError(f"the script uses {len(axes)} distinct tokens; at most {OTHER_AXIS} fit")
    axis = {t: i for i, t in enumerate(axes)}
    emb = np.zeros((vocab, D), np.float64)
    emb[np.arange(vocab), [axis.get(t, OTHER_AXIS) for t in range(vocab)]] = 1.0
    wv = np.zeros((KVH * HD, D))
    wv[np.arange(KVH * HD), np.arange(KVH * HD)] = 1.0     # v = the token axes (0..127)
    wo = np.zeros((D, H * HD))
    group = H // KVH
    for kv in range(KVH):        # query head kv*group reads kv head kv: its mean lands on axes 128 + ...
        wo[D // 2 + kv * HD + np.arange(HD), kv * group * HD + np.arange(HD)] = 1.0

    def rms(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x) + SHAPE["eps"])

    def features(win: list[int]) -> np.ndarray:
        # the graph in float64: uniform attention over the window (q = 0), zero experts
        v = np.stack([wv @ rms(emb[t]) for t in win])
        w = 1.0 / (len(win) + np.exp(SINK))
        heads = np.concatenate([w * v.sum(0)[(h // group) * HD:(h // group + 1) * HD] for h in range(H)])
        return rms(emb[win[-1]] + wo @ heads)

    rows: dict[bytes, tuple[np.ndarray, int, list[int]]] = {}
    for win, nxt in steps:
        f = features(win)
        seen = rows.setdefault(f.tobytes(), (f, nxt, win))
        if seen[1] != nxt:
            raise ValueError(f"window {win} is followed by {seen[1]} and by {nxt}: widen the window")
    phi = np.stack([r[0] for r in rows.values()])
    targets = sorted({r[1] for r in rows.values()})
    y = np.zeros((len(rows), len(targets)))
    y[np.arange(len(rows)), [targets.index(r[1]) for r in rows.values()]] = MARGIN
    sol = np.linalg.lstsq(phi, y, rcond=None)[0]          # (D, targets)
    head = np.zeros((vocab, D))
    head[targets] = sol.T
    for f, nxt, win in rows.values():
        logits = head @ f
        runner = np.max(np.delete(logits, nxt))
        if logits[nxt] - runner < MARGIN / 2:
            raise ValueError(f"window {win}: next token {nxt} wins by {logits[nxt] - runner:.2f} only")
    z = np.zeros
    t = {"token_embd.weight": emb, "output_norm.weight": np.ones(D), "output.weight": head}
    p = "blk.0."
    t.update({p + "attn_norm.weight": np.ones(D), p + "post_attention_norm.weight": np.ones(D),
              p + "attn_q.weight": z((H * HD, D)), p + "attn_q.bias": z(H * HD),
              p + "attn_k.weight": z((KVH * HD, D)), p + "attn_k.bias": z(KVH * HD),
              p + "attn_v.weight": wv, p + "attn_v.bias": z(KVH * HD),
              p + "attn_output.weight": wo, p + "attn_output.bias": z(D), p + "attn_sinks.weight": np.full(H, SINK),
              p + "ffn_gate_inp.weight": z((E, D)), p + "ffn_gate_inp.bias": z(E),
              p + "ffn_gate_exps.weight": z((E, X, D)), p + "ffn_gate_exps.bias": z((E, X)),
              p + "ffn_up_exps.weight": z((E, X, D)), p + "ffn_up_exps.bias": z((E, X)),
              p + "ffn_down_exps.weight": z((E, D, X)), p + "ffn_down_exps.bias": z((E, D))})
    return {k: np.ascontiguousarray(a, np.float32) for k, a in t.items()}


def write_scripted(out: str, spec: dict[str, Any]) -> None:
    """OUT.gguf of --script SPEC (see the module docstring)."""
    import o200k_vocab
    tk, v = _script_vocab(spec)
    tensors = scripted_weights(spec, len(v.tokens), _steps(spec, tk))
    h = SHAPE
    arch = "gpt-oss"
    w = GGUFWriter(out, arch)
    w.add_name("tiny-gpt-oss-scripted")
    w.add_block_count(1)
    w.add_context_length(h["ctx"])
    w.add_embedding_length(h["d_model"])
    w.add_feed_forward_length(h["d_expert"])
    w.add_head_count(h["n_heads"])
    w.add_head_count_kv(h["n_kv"])
    w.add_key_length(h["head_dim"])
    w.add_value_length(h["head_dim"])
    w.add_rope_dimension_count(h["head_dim"])
    w.add_rope_freq_base(h["rope_base"])
    w.add_rope_scaling_type(RopeScalingType.YARN)
    w.add_rope_scaling_factor(h["yarn_factor"])
    w.add_rope_scaling_orig_ctx_len(h["yarn_orig"])
    w.add_layer_norm_rms_eps(h["eps"])
    w.add_sliding_window(int(spec["window"]))
    w.add_expert_count(h["experts"])
    w.add_expert_used_count(h["top_k"])
    w.add_expert_feed_forward_length(h["d_expert"])
    w.add_vocab_size(len(v.tokens))
    w.add_file_type(0)
    o200k_vocab.add_to_writer(w, v)
    w.add_add_bos_token(False)
    w.add_chat_template(spec["template"])
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    ap.add_argument("--d-expert", type=int, metavar="N",
                    help="the experts' width (default: the shape's); 1024 with --widths 20b gives MXFP4 "
                         "slices of 1.57 MB, read from disk in several pieces")
    ap.add_argument("--mix", choices=sorted(GPTOSS_MIXES), default="f32",
                    help="matrix types: f32, or make_arch_fixture's mixes (q4_k_m: Q4_K, with Q6_K for v, "
                         "expert downs and the head)")
    ap.add_argument("--random-types", type=int, metavar="SEED",
                    help="every matrix draws its own type (make_arch_fixture.DRAW_TYPES) from SEED and its name")
    ap.add_argument("--tensor-type", action="append", default=[], metavar="REGEX=TYPE",
                    help="per-tensor type (first matching REGEX wins), as llama-quantize's")
    ap.add_argument("--script", metavar="SPEC.json",
                    help="a scripted model instead of random weights (see the module docstring)")
    a = ap.parse_args(argv)
    if a.script:
        import json
        write_scripted(a.out, json.loads(Path(a.script).read_text()))
        return 0
    if a.window < 1 or a.layers < 1:
        ap.error("--window and --layers must be >= 1")
    overrides = []
    for spec in a.tensor_type:
        pat, sep, tn = spec.rpartition("=")
        if not sep or not pat or tn not in GGMLQuantizationType.__members__:
            ap.error(f"--tensor-type {spec!r}: expected REGEX=TYPE with a GGML type name such as Q4_K")
        overrides.append((re.compile(pat), tn))
    h = WIDTHS_20B if a.widths == "20b" else SHAPE
    if a.d_expert:
        h = dict(h, d_expert=a.d_expert)
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
