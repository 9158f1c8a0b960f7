"""A llama file with one tensor per expert (older llama.cpp Mixtral GGUFs: blk.N.ffn_{gate,up,down}.E.weight)
serves through the protocol like the same weights stacked: the MODEL line, the same greedy text with
the experts in RAM and read from disk (EXPERT_RAM_MB=0: each expert read at its own tensor's offset),
and a file missing one expert's tensor refused before READY with one line naming it. The arithmetic:
tests/model/test_arch_split_experts.py."""
from __future__ import annotations

import struct

import pytest

from tests.native.engine import SCALE, parse_model_line
from tests.support import procs

pytestmark = pytest.mark.timeout(int(120 * SCALE))

PROMPT = b"[INST] Tell me about rivers. [/INST]"


def test_per_expert_file_through_the_protocol(spawn, tmp_path):
    stacked = procs.make_arch_fixture(tmp_path / "stacked.gguf", "llama")
    split = procs.make_arch_fixture(tmp_path / "split.gguf", "llama", "--split-experts")
    texts = []
    for path, env in ((stacked, {}), (split, {}), (split, {"EXPERT_RAM_MB": "0"})):
        e = spawn(model=str(path), slots=1, **env)
        e.wait(lambda: "MODEL" in e.latest, what="MODEL line")
        info = parse_model_line(e.latest["MODEL"])
        assert (info["arch"], info["n_experts"], info["top_k"]) == ("llama", 8, 2), info
        r = e.result(e.submit(PROMPT, slot=0, max_tokens=12))
        assert r.done is not None and r.text, r.errors
        texts.append(r.text)
        assert e.close() == 0
    assert texts[1] == texts[0], "per-expert tensors gave other tokens than the stacked ones"
    assert texts[2] == texts[0], "per-expert tensors read from disk gave other tokens"


def test_missing_expert_tensor_is_refused(spawn, tmp_path):
    split = procs.make_arch_fixture(tmp_path / "split.gguf", "llama", "--split-experts")
    data = bytearray(split.read_bytes())
    name = b"blk.1.ffn_up.5.weight"
    i = data.find(struct.pack("<Q", len(name)) + name)
    assert i >= 0
    data[i + 8:i + 8 + len(name)] = name.replace(b".weight", b".weighX")
    bad = tmp_path / "missing.gguf"
    bad.write_bytes(bytes(data))
    e = spawn(model=str(bad), wait_ready=False)
    rc = e.wait_exit(60 * SCALE)
    lines = e.stderr_text().strip().splitlines()
    assert not e.ready and rc == 3 and lines, (rc, lines[-3:])
    assert "blk.1.ffn_up.5.weight" in lines[-1] and len(lines[-1]) <= 400, lines[-1]
