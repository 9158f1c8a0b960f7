"""The engine's tokenizer gives exactly the token ids of HF `tokenizers` built from the same GGUF.

Reference: native/tools/check_tokenizer.py (BPE over the GGUF vocab + merges, pre-tokenizer
Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)],
control/user-defined entries added as atomic tokens; chunks with invalid UTF-8 are assembled from
HF's parts with the engine's documented one-byte-one-"other"-character rule).

Corpus, > 1 MB, per category so a failure names what broke:
  kjv      KJV verses (models/cache/kjv.jsonl, fetched by the default-model build)
  pydoc    CPython's pydoc_data.topics (English technical prose with code)
  mixed    check_tokenizer's deterministic generator: stdlib Python and C headers from this
           machine, numbers, whitespace runs, CJK, emoji, ChatML specials, invalid UTF-8.
The engine side is native/tests/tok_ids (one process for every chunk file), so the whole file
takes a few seconds; the comparison is tests/model/tok_compare's.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "native" / "tools"))
import check_tokenizer as ct  # noqa: E402
from tests.model.tok_compare import assert_identical, build_tok_ids  # noqa: E402

CHUNK = 4096


@pytest.fixture(scope="module")
def tok_ids(engine_binary):
    return build_tok_ids()


@pytest.fixture(scope="module")
def reference(default_model):
    return ct.Reference(str(default_model))


@pytest.fixture(scope="module")
def corpus(default_model, tmp_path_factory):
    from pydoc_data.topics import topics

    kjv_path = ROOT / "models" / "cache" / "kjv.jsonl"
    verses = [json.loads(ln)["text"] for ln in kjv_path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    mixed = tmp_path_factory.mktemp("tok") / "mixed.txt"
    ct.make_corpus(str(mixed), 600_000, 1234)
    return {
        # every 12th verse, one per line: all books, ~ 340 kB
        "kjv": "\n".join(verses[::12]).encode("utf-8"),
        "pydoc": "\n\n".join(topics[k] for k in sorted(topics))[:300_000].encode("utf-8"),
        "mixed": mixed.read_bytes(),
    }


def test_corpus_is_big_and_mixed(corpus):
    assert sum(map(len, corpus.values())) >= 1_000_000
    mixed = corpus["mixed"]
    for needle in (b"def ", b"#include", "中".encode(), "😀".encode(), b"<|im_end|>", b"\t", b"  "):
        assert needle in mixed, needle
    with pytest.raises(UnicodeDecodeError):
        mixed.decode("utf-8")


@pytest.mark.parametrize("category", ["kjv", "pydoc", "mixed"])
def test_ids_identical_to_hf_tokenizers(category, corpus, reference, tok_ids, default_model, tmp_path):
    parts = ct.chunks(corpus[category], CHUNK)
    ours = assert_identical(reference, tok_ids, default_model, parts, tmp_path, category)
    assert sum(map(len, ours)) > 20_000


def test_specials_atomic_and_digits_split(reference, default_model, tmp_path):
    text = "<|im_start|>user\nWhat is 2024 + 17?<|im_end|>\n<|im_start|>assistant\n"
    f = tmp_path / "t.txt"
    f.write_text(text, encoding="utf-8")
    out = subprocess.run([str(ROOT / "native" / "build" / "colibri-engine"), "-m", str(default_model),
                          "--tokenize", str(f)], capture_output=True, text=True, check=True).stdout
    ids = [int(x) for x in out.split()]
    assert ids == reference.encode(text.encode())
    assert ids.count(1) == 2 and ids.count(2) == 1           # <|im_start|> x2, <|im_end|> x1
    toks = [reference.tk.id_to_token(i) for i in ids]
    assert [t for t in toks if t.strip("Ġ").isdigit()] == ["2", "0", "2", "4", "1", "7"]


@pytest.fixture(scope="module")
def pre_variant(default_model, tmp_path_factory):
    """make(pre) -> a tokenizer-only GGUF: the default model's vocabulary and merges with
    tokenizer.ggml.pre = pre (the driver loads nothing else)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    d = tmp_path_factory.mktemp("pre")
    r = GGUFReader(str(default_model))

    def make(pre):
        out = d / f"{pre}.gguf"
        w = GGUFWriter(str(out), "llama")
        for field in r.fields.values():
            if not field.name.startswith("tokenizer.") or field.name == "tokenizer.ggml.pre":
                continue
            vtype = GGUFValueType(field.types[0])
            sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
            w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
        w.add_tokenizer_pre(pre)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return out
    return make


@pytest.mark.parametrize("pre", ["qwen2", "glm4"])
def test_llama3_family_pre_tokenizers_identical_to_hf(pre, pre_variant, corpus, tok_ids, tmp_path):
    """Qwen's (qwen2: single digits) and GLM's / Llama 3's (runs of up to 3 digits) split
    patterns, over the same mixed corpus as above (code, CJK, emoji, invalid UTF-8, specials)."""
    model = pre_variant(pre)
    parts = ct.chunks(corpus["mixed"] + corpus["pydoc"][:100_000], CHUNK)
    assert_identical(ct.Reference(str(model)), tok_ids, model, parts, tmp_path, pre)
