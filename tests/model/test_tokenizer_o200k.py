"""The engine's o200k tokenizer (gpt-oss: tokenizer.ggml.pre "gpt-4o") gives exactly the token
ids of HF `tokenizers` on the same vocabulary, and harmony's special tokens stay atomic.

Two vocabularies are trained here by HF `tokenizers` (native/tools/o200k_vocab.py), harmony's
specials appended as control tokens, each written into a tokenizer-only GGUF with pre "gpt-4o":
  o200k    trained over o200k's own pre-tokens (Split with the o200k pattern, then ByteLevel
           without its regex, as gpt-oss's tokenizer.json has it): a realistic vocabulary;
  traps    trained over whole lines, so its merges also join what the pattern keeps apart: any
           wrong split in the engine shows in the ids (a realistic vocabulary hides most).
Both are used with o200k's split. The reference is native/tools/check_tokenizer.py's HF tokenizer rebuilt
from that GGUF; the engine side is native/tests/tok_ids, which also checks that the pieces of
its ids give back the input bytes.

Corpus, per category so a failure names what broke:
  mixed    check_tokenizer's generator: stdlib Python and C headers, numbers, whitespace runs,
           CJK, emoji, specials, invalid UTF-8
  pydoc    CPython's pydoc_data.topics (English technical prose with code)
  o200k    a soup of what this pattern treats specially: case changes inside words, contractions
           in every case (and U+017F, which Oniguruma folds to s), Lt/Lm/Lo letters, combining
           marks alone and after letters or punctuation, digit runs, punctuation runs ending in
           / or line breaks, whitespace runs, harmony specials and near-misses
and hypothesis strings drawn from the same pieces and from any code point.
"""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "native" / "tools"))
import check_tokenizer as ct  # noqa: E402
import o200k_vocab  # noqa: E402
from tests.model.tok_compare import assert_identical, build_tok_ids, engine_encode  # noqa: E402

CHUNK = 4096

WORDS = ["hello", "Hello", "HELLO", "hELLO", "camelCase", "XMLHttpRequest", "iPhone", "McDonald's",
         "DON'T", "Don'T", "we'Re", "they'LL", "I'M", "I'm", "you'VE", "she'D", "it'ſ", "IT'ſ", "ſ", "'s",
         "'", "''", "'ll", "'LL", "'x", "ǅungla", "ǈ", "ʰ", "ᵃᵇ", "Aʰb", "日本語", "日A", "A日", "한국어",
         "e\u0301", "E\u0301", "\u0301", "\u0301\u0301A", "A\u0301", "!\u0301", " \u0301x", "\u0903",
         "क्षत्रिय", "\u20dd", "ß", "SS", "İstanbul", "ıi", "Ⅻ", "½", "x²", "ΑΒΓαβγ", "ΣΑΣ", "Привет",
         "ПРИВЕТмир", "naïve", "NAÏVE", "ﬁ", "ＡＢＣ", "ａｂｃ", "_init_", "__DUNDER__", "snake_case",
         "a1b2", "A1B2", "v2", "x86_64"]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "1234567", "1,000,000", "3.14159", "٣٤٥٦", "１２３４",
           "2026-12-06", "0x1F600", "1e-9", "-17"]
PUNCT = ["/", "//", "http://example.com/a/b?c=d", "</div>\n", "!!/\n/", "a/b", "./", "\\", "...", "?!\r\n",
         "->", "=>", "。", "「」", "(", ")", "{}", "[]", ";", ":", ",", ".", "!", "?", "#", "@", "*", "---",
         "/*", "*/", "//\n", " /", "/ ", "\n/", "%", "&&", "||", "<", ">", "<<", ">>"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u3000", "\u00a0", "\x0b", "\x0c", "\u0085",
          "\u2028", "   \n\n   ", "\r", "\t\n", " \t"]
SPECIALS = ["<|start|>", "<|end|>", "<|channel|>", "<|message|>", "<|return|>", "<|call|>", "<|constrain|>",
            "<|endoftext|>", "<|startoftext|>", "<|reserved_200010|>", "<|sta", "<|end|", "<<|end|>>",
            "<|end|><|start|>", "<|im_start|>"]
EMOJI = ["😀", "👍🏽", "👩‍💻", "🇫🇷", "❤️", "1️⃣", "🎉🎉", "✨"]
PIECES = WORDS + NUMBERS + PUNCT + SPACES + SPECIALS + EMOJI
INVALID = [b"\xff", b"\xc3", b"\xe2\x82", b"\x80", b"\xc5", b"'\xc5"]

HARMONY_PROMPT = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2026-12-06\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|><|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n# Tools\n\n"
    "## functions\n\nnamespace functions {\n\n// Gets the weather\ntype get_weather = (_: {\n"
    "location: string,\n}) => any;\n\n} // namespace functions<|end|>"
    "<|start|>user<|message|>What's the weather in Paris? It's 12°C, isn't it?<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>User asks weather; call the tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"location":"Paris"}<|call|>'
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 12}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It's 12 °C in Paris.<|return|>")


def o200k_soup(size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    out: list[bytes] = []
    total = 0
    while total < size:
        parts = []
        bad_ok = rng.random() < 0.02     # a few lines with invalid UTF-8, so most chunks stay valid
        for _ in range(rng.randrange(10, 120)):
            if bad_ok and rng.random() < 0.05:
                parts.append(rng.choice(INVALID))
            else:
                parts.append(rng.choice(PIECES).encode())
            if rng.random() < 0.4:
                parts.append(rng.choice(SPACES).encode())
        line = b"".join(parts) + b"\n"
        out.append(line)
        total += len(line)
    return b"".join(out)


@pytest.fixture(scope="module")
def tok_ids(engine_binary: Path) -> Path:
    return build_tok_ids()


@pytest.fixture(scope="module", params=["o200k", "traps"])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """(HF tokenizer as trained, the GGUF written from it)."""
    texts = o200k_vocab.default_texts() + o200k_soup(60_000, 5).decode("utf-8", "replace").splitlines(True)
    split = request.param == "o200k"
    if not split:
        texts = [ln for t in texts for ln in t.splitlines(True)]
    tk = o200k_vocab.train(texts, vocab_size=4000, split=split)
    path = tmp_path_factory.mktemp("o200k") / f"{request.param}-tiny.gguf"
    o200k_vocab.write_gguf(str(path), o200k_vocab.vocab_of(tk))
    return tk, path


@pytest.fixture(scope="module")
def reference(trained: tuple[Any, Path]) -> ct.Reference:
    return ct.Reference(str(trained[1]))


def test_trap_vocabulary_joins_across_pre_tokens(trained: tuple[Any, Path], reference: ct.Reference) -> None:
    """The traps vocabulary would tokenize differently without the split (the check that it
    can catch a wrong one); the o200k one is at least a real BPE with thousands of merges."""
    from tokenizers import pre_tokenizers

    tk, path = trained
    text = "".join(PIECES) * 3
    with_split = tk.encode(text, add_special_tokens=False).ids
    saved = tk.pre_tokenizer
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    try:
        without = tk.encode(text, add_special_tokens=False).ids
    finally:
        tk.pre_tokenizer = saved
    assert len(reference.tk.get_vocab()) > 3000
    if path.name.startswith("traps"):
        assert len(without) < 0.8 * len(with_split)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    from pydoc_data.topics import topics

    mixed = tmp_path_factory.mktemp("tok") / "mixed.txt"
    ct.make_corpus(str(mixed), 500_000, 1234)
    return {
        "mixed": mixed.read_bytes(),
        "pydoc": "\n\n".join(topics[k] for k in sorted(topics))[:250_000].encode("utf-8"),
        "o200k": o200k_soup(250_000, 38) + HARMONY_PROMPT.encode(),
    }


def test_corpus_has_what_the_pattern_treats_specially(corpus: dict[str, bytes]) -> None:
    soup = corpus["o200k"]
    for needle in ("XMLHttpRequest", "DON'T", "'ſ", "\u0301", "ǅ", "ʰ", "日本語", "1234567", "!!/\n/",
                   "\r\n", "<|channel|>", "<|sta", "👩‍💻"):
        assert needle.encode() in soup, needle
    assert sum(map(len, corpus.values())) >= 1_000_000
    with pytest.raises(UnicodeDecodeError):
        soup.decode("utf-8")


def test_gguf_carries_the_trained_tokenizer(trained: tuple[Any, Path], reference: ct.Reference,
                                            corpus: dict[str, bytes]) -> None:
    """check_tokenizer's reference, rebuilt from the GGUF, is the tokenizer that was trained:
    so the comparison below is against o200k's own pipeline, not a copy of the engine's view."""
    tk, _ = trained
    assert reference.pre == "gpt-4o"
    text = corpus["pydoc"][:60_000].decode() + HARMONY_PROMPT + "".join(PIECES)
    assert reference.tk.encode(text, add_special_tokens=False).ids == tk.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("category", ["mixed", "pydoc", "o200k"])
def test_ids_identical_to_hf_tokenizers(category: str, corpus: dict[str, bytes], reference: ct.Reference,
                                        tok_ids: Path, trained: tuple[Any, Path], tmp_path: Path) -> None:
    parts = ct.chunks(corpus[category], CHUNK)
    ours = assert_identical(reference, tok_ids, trained[1], parts, tmp_path, category)
    assert sum(map(len, ours)) > 20_000
    # decode round trip through HF's decoder, for the chunks HF can take
    n_checked = 0
    for p, mine in zip(parts, ours):
        try:
            text = p.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert reference.tk.decode(mine, skip_special_tokens=False) == text
        n_checked += 1
    assert n_checked >= len(parts) // 2


def test_harmony_specials_atomic(reference: ct.Reference, tok_ids: Path, trained: tuple[Any, Path],
                                 tmp_path: Path) -> None:
    (ours,) = engine_encode(tok_ids, trained[1], [HARMONY_PROMPT.encode()], tmp_path)
    assert ours == reference.encode(HARMONY_PROMPT.encode())
    vocab = reference.tk.get_vocab(with_added_tokens=True)
    for name, count in [("<|start|>", 7), ("<|message|>", 7), ("<|end|>", 5), ("<|channel|>", 4),
                        ("<|constrain|>", 1), ("<|call|>", 1), ("<|return|>", 1)]:
        assert ours.count(vocab[name]) == count, name


def _strings() -> st.SearchStrategy[list[str]]:
    element = st.one_of(st.sampled_from(PIECES), st.characters(codec="utf-8"),
                        st.sampled_from(SPACES + ["'", "ſ", "\u0301", "A", "a", "/"]))
    return st.lists(st.lists(element, max_size=40).map("".join), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=_strings())
def test_random_strings_identical_to_hf(texts: list[str], reference: ct.Reference, tok_ids: Path,
                                        trained: tuple[Any, Path], tmp_path: Path) -> None:
    parts = [t.encode() for t in texts]
    ours = assert_identical(reference, tok_ids, trained[1], parts, tmp_path, "random strings")
    for t, mine in zip(texts, ours):
        assert reference.tk.decode(mine, skip_special_tokens=False) == t


def test_harmony_end_of_generation_and_shown_tokens(tok_ids: Path, trained: tuple[Any, Path]) -> None:
    """llama.cpp's rule for harmony: with <|return|> and <|call|> there, <|end|> does not end
    generation (the analysis message closes with it) and shows as text, like the structure
    markers; the file's eos (<|return|>), <|call|> and <|endoftext|> end it."""
    out = subprocess.run([str(tok_ids), "--specials", str(trained[1])], capture_output=True, text=True,
                         check=True).stdout
    rows = {}
    for ln in out.splitlines():
        f = ln.split(" ", 3)
        rows[int(f[0])] = (f[1] == "1", f[2] == "1", f[3])
    by_name = {n: i for i, n in enumerate(o200k_vocab.vocab_of(trained[0]).tokens)}
    assert len(rows) == len(o200k_vocab.HARMONY_SPECIALS)
    eog = {n for n, i in by_name.items() if i in rows and rows[i][0]}
    shown = {rows[i][2] for i in rows if not rows[i][1]}
    assert eog == {"<|return|>", "<|call|>", "<|endoftext|>"}
    assert shown == {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>"}
    assert all(rows[i][2] == "" for i in rows if rows[i][1])      # control: no text in replies
