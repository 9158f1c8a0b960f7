#!/usr/bin/env python3
"""make_tiny_moe.py — write a seeded, random-weight tiny llama-architecture MoE GGUF.

Test fixture for the native engine (see docs: default-model.md §7). Same arguments ->
same bytes, every run, in well under a second.

    make_tiny_moe.py OUT.gguf [--shared-expert] [--dense] [--layers 4] [--experts 8]
                     [--top-k 2] [--seed 0] [--gating softmax|unit] [--f32]

Shape: d_model 128, 4 query heads / 2 KV heads (head_dim 32), dense FFN 256, routed expert
width 64, shared expert width 128, context 2048, rope base 10000, RMS eps 1e-5, tied output
head (no output.weight).

Tensors (ggml order: ne0 = row length = input dimension; numpy shapes are reversed):
  token_embd.weight            Q8_0  [ne0=d_model, ne1=vocab]
  output_norm.weight           F32   [d_model]
  blk.N.attn_norm / ffn_norm   F32   [d_model]
  blk.N.attn_q / attn_output   Q8_0  [d_model, d_model]
  blk.N.attn_k / attn_v        Q8_0  [d_model, n_kv_heads*head_dim]
  MoE:   blk.N.ffn_gate_inp    F32   [d_model, n_experts]            (router)
         blk.N.ffn_gate_exps   Q8_0  [d_model, d_expert, n_experts]
         blk.N.ffn_up_exps     Q8_0  [d_model, d_expert, n_experts]
         blk.N.ffn_down_exps   F16   [d_expert, d_model, n_experts]
         (--shared-expert) blk.N.ffn_{gate,up}_shexp Q8_0 [d_model, d_shexp],
                           blk.N.ffn_down_shexp Q8_0 [d_shexp, d_model]
  Dense: blk.N.ffn_gate / ffn_up Q8_0 [d_model, d_ff], ffn_down Q8_0 [d_ff, d_model]

--f32 stores every Q8_0/F16 matrix above as F32 instead (the same random values), for
tight engine-vs-numpy logit comparisons free of weight quantization error.

Metadata: llama.* hyper-parameters, llama.vocab_size, llama.expert_* (MoE only),
colibri.expert_gating = "softmax" | "unit" (string; MoE only), and a byte-level BPE
tokenizer (tokenizer.ggml.model "gpt2", pre "smollm"): 3 ChatML specials (ids 0-2,
type CONTROL), the 256 GPT-2 byte characters, then merges learned by a tiny
deterministic BPE trainer over an embedded corpus. BOS = 1 (<|im_start|>), EOS = 2
(<|im_end|>), ChatML chat template.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType, GGUFWriter
except ImportError:  # pragma: no cover
    sys.exit("make_tiny_moe.py: the 'gguf' package is required (pip install gguf)")

D_MODEL = 128
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = D_MODEL // N_HEADS
D_FF = 256
D_EXPERT = 64
D_SHEXP = 128
CTX = 2048
ROPE_BASE = 10000.0
RMS_EPS = 1e-5
N_MERGES = 200

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun, and the fox runs
into the forest. In the beginning there was the word, and the word was with the people of
the land. They worked the fields and they sang in the evening when the light was low.
What is the capital of France? The capital of France is Paris. Paris is a city on the Seine.
Give me three tips for staying healthy: eat well, sleep well, and walk every day.
Write a haiku about the sea. The sea is wide and the waves are cold under the moon.
A mixture of experts routes each token to a few experts; the router picks the top two.
The engine reads the model from disk, keeps the hot experts in memory and streams the rest.
This is a test of the tokenizer. It should handle words, numbers like 12345 and 2048,
punctuation (commas, periods; colons: and dashes - too) and new lines.

def forward(self, x):
    for layer in self.layers:
        x = x + layer.attention(layer.attn_norm(x))
        x = x + layer.feed_forward(layer.ffn_norm(x))
    return self.output(self.norm(x))

def main():
    print("hello, world")
    return 0

if __name__ == "__main__":
    main()

int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++) printf("%s\\n", argv[i]);
    return 0;
}

class Expert:
    def __init__(self, width):
        self.width = width
        self.count = 0

    def route(self, token):
        self.count += 1
        return self.width * token
"""

# GPT-2 pattern, ASCII approximation of \\p{L} / \\p{N}; smollm splits digits one by one.
_PRETOK = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def train_bpe(corpus: str, n_merges: int, byte_chars: dict[int, str]) -> tuple[list[str], list[str]]:
    """Tiny deterministic BPE trainer. Returns (new tokens in order, merges "a b")."""
    words = Counter()
    for piece in _PRETOK.findall(corpus):
        words["".join(byte_chars[b] for b in piece.encode("utf-8"))] += 1
    # Sorted for determinism; each word is a list of symbols.
    seqs = [(list(w), c) for w, c in sorted(words.items())]
    known = set(byte_chars.values())
    tokens: list[str] = []
    merges: list[str] = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for syms, c in seqs:
            for a, b in zip(syms, syms[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        # Most frequent; ties broken by the pair itself (lexicographic) for determinism.
        (a, b), _cnt = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = a + b
        merges.append(f"{a} {b}")
        if merged not in known:
            known.add(merged)
            tokens.append(merged)
        for i, (syms, c) in enumerate(seqs):
            if len(syms) < 2:
                continue
            out, j = [], 0
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(merged)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            seqs[i] = (out, c)
    return tokens, merges


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    byte_chars = bytes_to_unicode()
    new_tokens, merges = train_bpe(CORPUS, N_MERGES, byte_chars)
    tokens = list(SPECIALS) + [byte_chars[b] for b in range(256)] + new_tokens
    types = [int(gguf.TokenType.CONTROL)] * len(SPECIALS) + [int(gguf.TokenType.NORMAL)] * (len(tokens) - len(SPECIALS))
    return tokens, types, merges


def quant_q8(arr: np.ndarray) -> np.ndarray:
    return gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), GGMLQuantizationType.Q8_0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shared-expert", action="store_true", help="add a shared expert per layer")
    ap.add_argument("--dense", action="store_true", help="dense FFN instead of MoE")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gating", choices=["softmax", "unit"], default="softmax")
    ap.add_argument("--f32", action="store_true", help="all matrices F32 (no weight quantization)")
    ap.add_argument("--mute-eos", action="store_true",
                    help="near-zero EOS row too: replies never end by themselves (for stop/cancel tests)")
    ap.add_argument("--sampling-temp", type=float, help="write general.sampling.temp")
    ap.add_argument("--sampling-top-p", type=float, help="write general.sampling.top_p")
    ap.add_argument("--sampling-top-k", type=int, help="write general.sampling.top_k")
    a = ap.parse_args(argv)
    if a.layers < 1 or (not a.dense and not (1 <= a.top_k <= a.experts)):
        ap.error("need layers >= 1 and 1 <= top-k <= experts")

    rng = np.random.default_rng(a.seed)
    tokens, types, merges = build_vocab()
    vocab = len(tokens)

    def mat(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        # numpy (rows=ne1, cols=ne0); fan_in = cols
        return (rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    name = "tiny-" + ("dense" if a.dense else f"moe{a.experts}x{a.top_k}" + ("-shexp" if a.shared_expert else ""))
    name += "-f32" if a.f32 else ""
    w = GGUFWriter(a.out, "llama")
    w.add_name(name)
    w.add_block_count(a.layers)
    w.add_context_length(CTX)
    w.add_embedding_length(D_MODEL)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV_HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_vocab_size(vocab)
    if not a.dense:
        w.add_expert_count(a.experts)
        w.add_expert_used_count(a.top_k)
        w.add_expert_feed_forward_length(D_EXPERT)
        if a.shared_expert:
            w.add_expert_shared_feed_forward_length(D_SHEXP)
        w.add_string("colibri.expert_gating", a.gating)
    if a.sampling_temp is not None:
        w.add_float32("general.sampling.temp", a.sampling_temp)
    if a.sampling_top_p is not None:
        w.add_float32("general.sampling.top_p", a.sampling_top_p)
    if a.sampling_top_k is not None:
        w.add_int32("general.sampling.top_k", a.sampling_top_k)
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32 if a.f32 else gguf.LlamaFileType.MOSTLY_Q8_0))

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    Q8 = None if a.f32 else GGMLQuantizationType.Q8_0

    def q8(arr: np.ndarray) -> np.ndarray:   # the matrix encoding: Q8_0, or F32 with --f32
        return np.ascontiguousarray(arr, dtype=np.float32) if a.f32 else quant_q8(arr)
    # Embedding scale 0.15: the tied head's logits then have std ~1.7, so greedy decoding is
    # still decisive but temperature-1 sampling visits many different tokens (byte tokens too).
    embd = rng.standard_normal((vocab, D_MODEL), dtype=np.float32) * np.float32(0.15)
    # Markup tokens (<|endoftext|>, <|im_start|>) get near-zero rows so the tied head rarely
    # samples them: their DATA is empty, and a reply of nothing but markup tests nothing.
    embd[:3 if a.mute_eos else 2] *= np.float32(0.02)
    w.add_tensor("token_embd.weight", q8(embd), raw_dtype=Q8)
    w.add_tensor("output_norm.weight", norm_w(D_MODEL))
    kv_dim = N_KV_HEADS * HEAD_DIM
    for L in range(a.layers):
        p = f"blk.{L}."
        w.add_tensor(p + "attn_norm.weight", norm_w(D_MODEL))
        w.add_tensor(p + "attn_q.weight", q8(mat(D_MODEL, D_MODEL)), raw_dtype=Q8)
        w.add_tensor(p + "attn_k.weight", q8(mat(kv_dim, D_MODEL)), raw_dtype=Q8)
        w.add_tensor(p + "attn_v.weight", q8(mat(kv_dim, D_MODEL)), raw_dtype=Q8)
        w.add_tensor(p + "attn_output.weight", q8(mat(D_MODEL, D_MODEL, 0.5)), raw_dtype=Q8)
        w.add_tensor(p + "ffn_norm.weight", norm_w(D_MODEL))
        if a.dense:
            w.add_tensor(p + "ffn_gate.weight", q8(mat(D_FF, D_MODEL)), raw_dtype=Q8)
            w.add_tensor(p + "ffn_up.weight", q8(mat(D_FF, D_MODEL)), raw_dtype=Q8)
            w.add_tensor(p + "ffn_down.weight", q8(mat(D_MODEL, D_FF, 0.5)), raw_dtype=Q8)
            continue
        E = a.experts
        # Router: strong enough that routing differs across tokens (all experts get used).
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, D_MODEL, 4.0))
        gate = (rng.standard_normal((E, D_EXPERT, D_MODEL), dtype=np.float32) / np.sqrt(D_MODEL)).astype(np.float32)
        up = (rng.standard_normal((E, D_EXPERT, D_MODEL), dtype=np.float32) / np.sqrt(D_MODEL)).astype(np.float32)
        down = (rng.standard_normal((E, D_MODEL, D_EXPERT), dtype=np.float32) * (0.5 / np.sqrt(D_EXPERT)))
        down = down.astype(np.float32 if a.f32 else np.float16)
        w.add_tensor(p + "ffn_gate_exps.weight", q8(gate), raw_dtype=Q8)
        w.add_tensor(p + "ffn_up_exps.weight", q8(up), raw_dtype=Q8)
        w.add_tensor(p + "ffn_down_exps.weight", down)
        if a.shared_expert:
            w.add_tensor(p + "ffn_gate_shexp.weight", q8(mat(D_SHEXP, D_MODEL)), raw_dtype=Q8)
            w.add_tensor(p + "ffn_up_shexp.weight", q8(mat(D_SHEXP, D_MODEL)), raw_dtype=Q8)
            w.add_tensor(p + "ffn_down_shexp.weight", q8(mat(D_MODEL, D_SHEXP, 0.5)), raw_dtype=Q8)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
