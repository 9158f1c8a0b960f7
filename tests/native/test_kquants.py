"""K-quant, Q5_0/Q5_1, IQ1_S … IQ4_XS, MXFP4 and BF16 dequantization: the engine's dequant_row (the values its EXACT mode and
its kernels' weights are) equals gguf's numpy dequantizers bit for bit, on random blocks (random
codes and scales, finite fp16 d/dmin) and on blocks with extreme scales."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from tests.native.engine import ROOT

# ggml type -> (block bytes, offsets of fp16 fields)
LAYOUT = {
    T.Q2_K: (84, (80, 82)),
    T.Q3_K: (110, (108,)),
    T.Q4_K: (144, (0, 2)),
    T.Q5_K: (176, (0, 2)),
    T.Q6_K: (210, (208,)),
    T.Q5_0: (22, (0,)),         # blocks of 32: f16 d, u32 qh, 16 nibble bytes
    T.Q5_1: (24, (0, 2)),       # f16 d, f16 m, u32 qh, 16 nibble bytes
    T.IQ4_NL: (18, (0,)),       # blocks of 32: f16 d, 16 bytes of codes into the int8 table
    T.IQ4_XS: (136, (0,)),      # f16 d, u16 scales_h, u8 scales_l[4], 128 bytes of codes
    # the grid types: f16 d first (IQ1_M: its bits in the top nibbles of the last 4 u16s, set below)
    T.IQ1_S: (50, (0,)), T.IQ1_M: (56, ()), T.IQ2_XXS: (66, (0,)), T.IQ2_XS: (74, (0,)),
    T.IQ2_S: (82, (0,)), T.IQ3_XXS: (98, (0,)), T.IQ3_S: (110, (0,)),
}
BLOCK_VALUES = {T.Q5_0: 32, T.Q5_1: 32, T.IQ4_NL: 32}   # others: 256


@pytest.fixture(scope="module")
def deq_dump():
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/deq_dump"], check=True)
    return ROOT / "native" / "build" / "deq_dump"


def engine_dequant(deq_dump, tmp_path, qtype, raw: np.ndarray, n: int) -> np.ndarray:
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(raw.tobytes())
    subprocess.run([str(deq_dump), str(int(qtype)), str(n), str(src), str(dst)], check=True)
    return np.fromfile(dst, dtype=np.float32).reshape(-1, n)


def random_blocks(rng, qtype, n_blocks, extreme=False):
    size, f16_at = LAYOUT[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in f16_at:
        if extreme:   # the largest finite fp16 magnitudes, negative ones, subnormals, zero
            vals = rng.choice(np.array([65504.0, -65504.0, 6e-8, -6e-8, 0.0, 1.0, -0.5], dtype=np.float16), n_blocks)
        else:
            vals = (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)
        b[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.IQ1_M:        # d's f16 bits, 4 at a time, in the top nibbles of u16 sc[0..3] (bytes 48-55)
        d = (rng.choice(np.array([65504.0, -65504.0, 6e-8, 0.0, 1.0], dtype=np.float16), n_blocks) if extreme
             else (rng.standard_normal(n_blocks) * 0.01).astype(np.float16)).view(np.uint16)
        sc = b[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for i in range(4):
            sc[:, i] |= ((d >> np.uint16(4 * i)) & np.uint16(15)) << np.uint16(12)
        b[:, 48:56] = sc.view(np.uint8)
    return b


@pytest.mark.parametrize("qtype", list(LAYOUT), ids=lambda t: t.name)
@pytest.mark.parametrize("extreme", [False, True], ids=["random", "extreme"])
def test_k_quant_dequant_is_bit_exact(deq_dump, tmp_path, qtype, extreme):
    rng = np.random.default_rng(int(qtype) * 7 + extreme)
    bv = BLOCK_VALUES.get(qtype, 256)
    rows, per_row = 24, 1024 // bv             # rows of 1024 values
    raw = random_blocks(rng, qtype, rows * per_row, extreme).reshape(rows, -1)
    want = dequantize(raw, qtype).astype(np.float32)
    got = engine_dequant(deq_dump, tmp_path, qtype, raw, bv * per_row)
    assert want.shape == got.shape
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), (
        f"{qtype.name}: {np.sum(want.view(np.uint32) != got.view(np.uint32))} values differ")


def test_bf16_dequant_is_bit_exact(deq_dump, tmp_path):
    rng = np.random.default_rng(30)
    x = np.concatenate([rng.standard_normal(4000).astype(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, 3e38, -1e-40, 1e-45], dtype=np.float32)])
    x = np.resize(x, 16 * 256).reshape(16, 256)
    raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    want = dequantize(raw, T.BF16).astype(np.float32)
    got = engine_dequant(deq_dump, tmp_path, T.BF16, raw, 256)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


# ---- MXFP4 (GGML 39): the oracles are gguf-py's MXFP4 dequantizer (gguf >= 0.19; with an older
# gguf, the one in a llama.cpp source tree's gguf-py where there is one), the OCP spec re-derived
# here in float64 (e2m1 from its bits, the block's E8M0 exponent), and, where it is built here,
# llama.cpp's C dequantize_row_mxfp4 (libggml-base, via ctypes).
MXFP4 = 39
MXFP4_BLOCK = 17                 # u8 e, then 16 bytes: byte i = value i (low nibble), 16 + i (high)
LLAMA_CPP_SRC = Path(os.environ.get(
    "LLAMA_CPP_SRC", "/work/llcpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
LLCPP_SITE = Path(os.environ.get("LLCPP_VENV", "/work/llcpp-venv")) / "lib"


def mxfp4_blocks(rng: np.random.Generator, rows: int, per_row: int) -> np.ndarray:
    """Random codes; every exponent byte 0..255 appears (block k of the whole set has e = k % 256)."""
    b = rng.integers(0, 256, size=(rows * per_row, MXFP4_BLOCK), dtype=np.uint8)
    b[:, 0] = np.arange(rows * per_row) % 256
    return b.reshape(rows, per_row * MXFP4_BLOCK)


def mxfp4_spec_f64(raw: np.ndarray) -> np.ndarray:
    """float64 values from the spec: e2m1 code s.ee.m = (-1)^s (ee ? (1 + m/2) 2^(ee-1) : m/2),
    times the scale 2^(e - 127); -0 reads as +0 (llama.cpp's int8 table of doubled values)."""
    blocks = raw.reshape(-1, MXFP4_BLOCK)
    e = blocks[:, :1].astype(np.float64)
    qs = blocks[:, 1:]
    codes = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)
    sign = np.where(codes & 8, -1.0, 1.0)
    ex, m = (codes >> 1) & 3, codes & 1
    mag = np.where(ex == 0, m * 0.5, (1.0 + m * 0.5) * np.exp2(ex - 1.0))
    vals = np.where(mag == 0, 0.0, sign * mag) * np.exp2(e - 127.0)
    return vals.reshape(raw.shape[0], -1)


@pytest.fixture(scope="module")
def mxfp4_raw() -> np.ndarray:
    return mxfp4_blocks(np.random.default_rng(39), 16, 64)   # 1024 blocks: each exponent 4 times


def test_mxfp4_dequant_equals_the_spec(deq_dump, tmp_path, mxfp4_raw):
    want64 = mxfp4_spec_f64(mxfp4_raw)
    got = engine_dequant(deq_dump, tmp_path, MXFP4, mxfp4_raw, 64 * 32)
    with np.errstate(over="ignore"):
        want = want64.astype(np.float32)        # exact, or inf where 6 * 2^128 > FLT_MAX (e = 255)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    finite = np.isfinite(got)
    assert np.array_equal(got[finite].astype(np.float64), want64[finite])
    assert (~finite).any()                      # the e = 255 blocks' largest codes did overflow


def test_mxfp4_dequant_equals_gguf_py(deq_dump, tmp_path, mxfp4_raw):
    if hasattr(T, "MXFP4"):
        with np.errstate(over="ignore"):        # e = 255: 6 * 2^128 is inf in float32
            want = dequantize(mxfp4_raw, T.MXFP4).astype(np.float32)
    else:
        quants = LLAMA_CPP_SRC / "gguf-py"
        if "class MXFP4" not in ((quants / "gguf" / "quants.py").read_text() if quants.exists() else ""):
            pytest.skip(f"gguf {version('gguf')} has no MXFP4 and no gguf-py with it at {quants} (set LLAMA_CPP_SRC)")
        src, dst = tmp_path / "raw.npy", tmp_path / "want.npy"
        np.save(src, mxfp4_raw)
        code = ("import sys, numpy as np; from gguf.quants import dequantize; from gguf import GGMLQuantizationType as T; "
                "np.save(sys.argv[2], dequantize(np.load(sys.argv[1]), T.MXFP4).astype(np.float32))")
        subprocess.run([sys.executable, "-c", code, str(src), str(dst)], check=True,
                       env={**os.environ, "PYTHONPATH": str(quants)})
        want = np.load(dst)
    got = engine_dequant(deq_dump, tmp_path, MXFP4, mxfp4_raw, 64 * 32)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


def llama_cpp_dequant(name: str, raw: np.ndarray, n: int) -> np.ndarray:
    """llama.cpp's own C dequantizer of a type (libggml-base's dequantize_row_<name>, via ctypes)."""
    libs = sorted(LLCPP_SITE.glob("python3*/site-packages/llama_cpp/lib/libggml-base.so"))
    if not libs:
        pytest.skip(f"no llama-cpp-python build under {LLCPP_SITE} (set LLCPP_VENV)")
    fn = getattr(ctypes.CDLL(str(libs[0])), f"dequantize_row_{name}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    raw = np.ascontiguousarray(raw)
    out = np.empty((raw.shape[0], n), dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, out.size)
    return out


def test_mxfp4_dequant_equals_llama_cpp(deq_dump, tmp_path, mxfp4_raw):
    want = llama_cpp_dequant("mxfp4", mxfp4_raw, 64 * 32)
    got = engine_dequant(deq_dump, tmp_path, MXFP4, mxfp4_raw, 64 * 32)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))


IQ_LOW = [T.IQ1_S, T.IQ1_M, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S]


@pytest.mark.parametrize("qtype", IQ_LOW, ids=lambda t: t.name)
def test_iq_dequant_equals_llama_cpp(deq_dump, tmp_path, qtype):
    """The grid types against llama.cpp's C dequantizers too (its grids, not gguf-py's copies)."""
    rng = np.random.default_rng(int(qtype) * 11)
    raw = random_blocks(rng, qtype, 16 * 4).reshape(16, -1)
    want = llama_cpp_dequant(qtype.name.lower(), raw, 1024)
    got = engine_dequant(deq_dump, tmp_path, qtype, raw, 1024)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
