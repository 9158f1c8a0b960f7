#!/usr/bin/env python3
"""o200k_vocab.py — a small o200k-style (gpt-oss) byte-level BPE vocabulary, trained by HF
`tokenizers`, and its GGUF tokenizer metadata.

The real gpt-oss files carry OpenAI's o200k_harmony vocabulary (201,088 tokens); this makes one
of the same form, a few thousand tokens, for tests and tiny fixture models:
  - pre-tokenizer as in o200k's tokenizer.json: Split(O200K_PATTERN, isolated), then
    ByteLevel(add_prefix_space=False, use_regex=False); ByteLevel decoder;
  - the 256 byte characters, then BPE merges learned over the given text;
  - harmony's special tokens after them, in o200k_harmony's order (ids 199998..200012 there),
    all control (GGUF token type 3), as convert_hf_to_gguf writes them.
GGUF metadata: tokenizer.ggml.model "gpt2", pre "gpt-4o", bos <|startoftext|>, eos <|return|>,
padding <|endoftext|> (the ids the ggml-org gpt-oss files name).

    o200k_vocab.py OUT.gguf [--vocab-size 4000]    # a tokenizer-only GGUF (arch gpt-oss)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_tokenizer import O200K_PATTERN  # noqa: E402  (one copy of the pattern)

# o200k_harmony ids 199998..200012, in order
HARMONY_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>",
                    "<|return|>", "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>",
                    "<|end|>", "<|message|>", "<|reserved_200009|>", "<|reserved_200010|>",
                    "<|reserved_200011|>", "<|call|>"]
CONTROL = 3


@dataclass
class Vocab:
    tokens: list[str]        # byte-level token strings, id order
    types: list[int]         # GGUF token types (1 normal, 3 control)
    merges: list[str]        # "left right", rank order
    bos: int
    eos: int
    pad: int


def o200k_tokenizer():  # -> tokenizers.Tokenizer (untyped package)
    """An empty BPE tokenizer with o200k's pre-tokenizer and decoder."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


def train(texts: Iterable[str], vocab_size: int = 4000, split: bool = True):  # -> tokenizers.Tokenizer
    """Train the BPE over texts; the harmony specials are added after the learned tokens.
    split=False trains over whole texts, not o200k's pre-tokens, so the merges also join what
    the pattern keeps apart: a vocabulary that shows any wrong split in the token ids (the
    tokenizer returned splits as o200k does either way)."""
    from tokenizers import AddedToken, pre_tokenizers, trainers
    tk = o200k_tokenizer()
    if not split:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, trainer=trainer)
    tk.pre_tokenizer = o200k_tokenizer().pre_tokenizer
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in HARMONY_SPECIALS])
    return tk


def vocab_of(tk) -> Vocab:
    """The GGUF tables of a tokenizer made by train()."""
    model = json.loads(tk.to_str())["model"]
    by_id = {i: t for t, i in tk.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError("vocabulary ids are not 0..n-1")
    tokens = [by_id[i] for i in range(len(by_id))]
    special = set(HARMONY_SPECIALS)
    types = [CONTROL if t in special else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    return Vocab(tokens, types, merges, ids["<|startoftext|>"], ids["<|return|>"], ids["<|endoftext|>"])


def add_to_writer(w, v: Vocab) -> None:
    """Write v's tokenizer.* keys into a gguf.GGUFWriter."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges(v.merges)
    w.add_bos_token_id(v.bos)
    w.add_eos_token_id(v.eos)
    w.add_pad_token_id(v.pad)


def write_gguf(path: str, v: Vocab) -> None:
    """A GGUF with nothing but the tokenizer (the engine's tok_ids driver reads only that)."""
    from gguf import GGUFWriter
    w = GGUFWriter(path, "gpt-oss")
    add_to_writer(w, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def default_texts() -> list[str]:
    """Training text: CPython's pydoc topics and check_tokenizer's mixed corpus (code, numbers,
    CJK, emoji, whitespace runs), as lines."""
    import tempfile

    from pydoc_data.topics import topics

    import check_tokenizer as ct
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "mixed.txt")
        ct.make_corpus(p, 400_000, 77)
        mixed = open(p, "rb").read().decode("utf-8", errors="replace")
    return [topics[k] for k in sorted(topics)] + mixed.splitlines(keepends=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--vocab-size", type=int, default=4000)
    args = ap.parse_args(argv)
    v = vocab_of(train(default_texts(), args.vocab_size))
    write_gguf(args.out, v)
    print("wrote %s: %d tokens, %d merges" % (args.out, len(v.tokens), len(v.merges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
