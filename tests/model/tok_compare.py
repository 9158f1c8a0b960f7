"""The engine's token ids against HF `tokenizers` for a list of chunks: what the tokenizer tests
(test_tokenizer_exact, test_tokenizer_o200k) share.

The engine side is native/tests/tok_ids: one process for every chunk file, which also checks that
the pieces of its ids give back the input bytes. The reference is native/tools/check_tokenizer.py's
HF tokenizer rebuilt from the same GGUF.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "native" / "tools"))
import check_tokenizer as ct  # noqa: E402

TOK_IDS = ROOT / "native" / "build" / "tok_ids"


def build_tok_ids() -> Path:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/tok_ids"], check=True)
    return TOK_IDS


def engine_encode(tok_ids: Path, model: Path, parts: list[bytes], tmp_path: Path) -> list[list[int]]:
    """The engine's ids of each chunk, one tok_ids run for all; asserts it ran clean (a known
    pre-tokenizer, the pieces giving back the input) and answered every chunk."""
    files = []
    for i, p in enumerate(parts):
        f = tmp_path / f"c{i:05d}.txt"
        f.write_bytes(p)
        files.append(str(f))
    res = subprocess.run([str(tok_ids), str(model), *files], capture_output=True, text=True)
    assert "not known" not in res.stderr, res.stderr
    assert res.returncode == 0, res.stderr     # includes: pieces give back the input bytes
    ours = [[int(x) for x in ln.split()] for ln in res.stdout.splitlines()]
    assert len(ours) == len(parts)
    return ours


def differences(reference: ct.Reference, parts: list[bytes], ours: list[list[int]]) -> list[str]:
    """One line per chunk whose ids differ from HF's: the chunk's start and the tokens around the
    first difference, on both sides."""
    bad = []
    for p, mine in zip(parts, ours):
        theirs = reference.encode(p)
        if mine != theirs:
            k = next((i for i in range(min(len(mine), len(theirs))) if mine[i] != theirs[i]),
                     min(len(mine), len(theirs)))
            bad.append(f"chunk {p[:60]!r}: first difference at token {k}: "
                       f"engine {[reference.tk.id_to_token(x) for x in mine[max(0, k - 2):k + 4]]} "
                       f"hf {[reference.tk.id_to_token(x) for x in theirs[max(0, k - 2):k + 4]]}")
    return bad


def assert_identical(reference: ct.Reference, tok_ids: Path, model: Path, parts: list[bytes], tmp_path: Path,
                     what: str) -> list[list[int]]:
    """The engine's ids of every chunk are HF's; returns them. `what` names the corpus in the
    failure, which shows the first five chunks that differ."""
    ours = engine_encode(tok_ids, model, parts, tmp_path)
    bad = differences(reference, parts, ours)
    assert not bad, f"{what}: {len(bad)}/{len(parts)} chunks differ:\n" + "\n".join(bad[:5])
    return ours
