"""A file the engine does not fully know is refused at load, before READY, with one stderr line
naming what it does not know and exit code 3 (a restart cannot help: the bridge reports it):
a tensor its architecture's loader never reads, a key of the architecture's namespace it never
reads, a tensor type it has no kernel for, an architecture it does not have. The trailing
MTP / NextN blocks that <arch>.nextn_predict_layers announces are known and skipped, for any
architecture: a qwen3moe file with such a block gives the logits of the file without it; without
the key the block is a trunk block whose nextn.* tensors are unknown.
"""
from __future__ import annotations

import struct
import subprocess

import numpy as np
import pytest

from tests.model.gguf_slice import add_raw, copy_writer, write_out
from tests.model.test_arch_oracle import engine_logits
from tests.support import procs

EXIT_REFUSED = 3


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return procs.make_arch_fixture(tmp_path_factory.mktemp("unknown") / "qwen3moe.gguf", "qwen3moe", "--f32")


def refusal(engine_binary, path):
    p = subprocess.run([str(engine_binary), "-m", str(path), "-p", "hi", "-n", "1"], capture_output=True, text=True,
                       timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == EXIT_REFUSED and lines, (p.returncode, p.stderr[-400:])
    assert lines[-1].startswith(f"colibri-engine: refused {path}: ") and len(lines[-1]) <= 600, lines[-1]
    return lines[-1]


def rewrite(src, dst, new_keys=None, extra=None, nextn=0):
    """src plus uint32 keys, extra tensors (name -> array), and `nextn` copies of its last block
    appended as trailing blocks (block_count raised to match)."""
    r, w, arch = copy_writer(src, dst, {})
    if nextn:
        n = int(r.fields[f"{arch}.block_count"].parts[-1][0])
        r, w, arch = copy_writer(src, dst, {f"{arch}.block_count": n + nextn})
    for k, v in (new_keys or {}).items():
        w.add_uint32(k, v)
    for t in r.tensors:
        add_raw(w, t)
    for k in range(nextn):
        last = f"blk.{n - 1}."
        for t in r.tensors:
            if t.name.startswith(last):
                w.add_tensor(f"blk.{n + k}." + t.name[len(last):], np.asarray(t.data))
    for name, arr in (extra or {}).items():
        w.add_tensor(name, arr)
    return write_out(w, dst)


def test_an_unknown_tensor_is_refused(base, engine_binary, tmp_path):
    bad = rewrite(base, tmp_path / "t.gguf", extra={"blk.0.ffn_mystery.weight": np.ones((4, 256), np.float32)})
    assert "tensor blk.0.ffn_mystery.weight is not known" in refusal(engine_binary, bad)


def test_an_unknown_architecture_key_is_refused(base, engine_binary, tmp_path):
    bad = rewrite(base, tmp_path / "k.gguf", new_keys={"qwen3moe.attention.sliding_window": 128})
    assert "key qwen3moe.attention.sliding_window is not known" in refusal(engine_binary, bad)


def test_an_unknown_tensor_type_is_refused(base, engine_binary, tmp_path):
    data = bytearray(base.read_bytes())
    name = b"blk.0.attn_norm.weight"
    i = data.find(struct.pack("<Q", len(name)) + name)
    assert i >= 0
    at = i + 8 + len(name)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, 31)     # type 31: no such ggml type today
    bad = tmp_path / "type.gguf"
    bad.write_bytes(bytes(data))
    line = refusal(engine_binary, bad)
    assert "blk.0.attn_norm.weight" in line and "(31)" in line, line


def test_an_unknown_architecture_is_refused(base, engine_binary, tmp_path):
    data = bytearray(base.read_bytes())
    key = b"general.architecture"
    i = data.find(struct.pack("<Q", len(key)) + key)
    at = i + 8 + len(key) + 4 + 8                               # type u32, string length u64
    assert data[at:at + 8] == b"qwen3moe"
    data[at:at + 8] = b"qwen9moe"
    bad = tmp_path / "arch.gguf"
    bad.write_bytes(bytes(data))
    assert "architecture 'qwen9moe' is not supported" in refusal(engine_binary, bad)


def test_trailing_nextn_blocks_are_skipped_on_any_architecture(base, fwd_dump, engine_binary, tmp_path):  # noqa: F811
    mtp = {"blk.2.nextn.eh_proj.weight": np.ones((256, 512), np.float32),      # the MTP head's own tensors
           "blk.2.nextn.enorm.weight": np.ones(256, np.float32), "blk.2.nextn.hnorm.weight": np.ones(256, np.float32)}
    with_mtp = rewrite(base, tmp_path / "mtp.gguf", new_keys={"qwen3moe.nextn_predict_layers": 1}, extra=mtp, nextn=1)
    ids = [5, 17, 42, 99, 7, 250, 33, 8]
    a = engine_logits(fwd_dump, base, ids, -1, tmp_path, EXACT="1", KV_TYPE="f32")
    b = engine_logits(fwd_dump, with_mtp, ids, -1, tmp_path, EXACT="1", KV_TYPE="f32")
    assert np.array_equal(a, b), "a trailing nextn block changed the trunk's logits"
    # without the key the block is the trunk's third, whose nextn tensors no loader reads
    unannounced = rewrite(base, tmp_path / "extra.gguf", extra=mtp, nextn=1)
    line = refusal(engine_binary, unannounced)
    assert "tensor blk.2.nextn." in line, line
