#!/usr/bin/env python3
"""Requantize tensors of a GGUF with llama.cpp's own quantizer (libggml-base's ggml_quantize_chunk,
via ctypes), with a generated importance matrix where the type needs one (IQ1_*, IQ2_XXS, IQ2_XS,
IQ2_S): the test files of the IQ types "made by llama.cpp", as the UD files are.

    llama_requant.py IN.gguf OUT.gguf REGEX=TYPE [REGEX=TYPE ...] [--seed N]

Every tensor whose name matches a REGEX (first match wins) must be F32 in IN; it is quantized to
TYPE row by row (a stacked expert tensor [E, rows, cols] as E * rows rows). The importance matrix
is one positive weight per column, as llama.cpp's imatrix tool collects (mean squared
activations): here drawn from a seeded log-normal, so the files are reproducible. Other tensors
and every key are copied as they are.

Runs in llama-cpp-python's environment (LLCPP_VENV, default /work/llcpp-venv: its gguf and
numpy, its lib/libggml-base.so).
"""
from __future__ import annotations

import argparse
import ctypes
import re
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter


def libggml() -> ctypes.CDLL:
    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_row_size.restype = ctypes.c_size_t
    return lib


def quantize(lib: ctypes.CDLL, x: np.ndarray, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """x [..., cols] float32 -> [..., row bytes] uint8 in llama.cpp's blocks of qtype."""
    cols = x.shape[-1]
    src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, cols)
    rb = lib.ggml_row_size(int(qtype), cols)
    dst = np.zeros((src.shape[0], rb), dtype=np.uint8)
    imatrix = np.exp(rng.standard_normal(cols)).astype(np.float32)        # mean squared activations
    need = lib.ggml_quantize_requires_imatrix(int(qtype))
    done = lib.ggml_quantize_chunk(int(qtype), src.ctypes.data, dst.ctypes.data, 0, src.shape[0], cols,
                                   imatrix.ctypes.data if need else None)
    assert done == dst.size, f"{qtype.name}: wrote {done} bytes, want {dst.size}"
    return dst.reshape(*x.shape[:-1], rb)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("rules", nargs="+", metavar="REGEX=TYPE")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    rules = []
    for spec in a.rules:
        pat, sep, tn = spec.rpartition("=")
        if not sep or tn not in GGMLQuantizationType.__members__:
            ap.error(f"{spec!r}: expected REGEX=TYPE with a GGML type name")
        rules.append((re.compile(pat), GGMLQuantizationType[tn]))
    lib, rng = libggml(), np.random.default_rng(a.seed)
    r = GGUFReader(a.src)
    arch = bytes(r.fields["general.architecture"].parts[r.fields["general.architecture"].data[0]]).decode()
    w = GGUFWriter(a.dst, arch)
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        qtype = next((q for pat, q in rules if pat.search(t.name)), None)
        data = np.asarray(t.data)
        shape = [int(v) for v in reversed(t.shape)]
        if qtype is None:
            raw = GGMLQuantizationType(int(t.tensor_type))
            w.add_tensor(t.name, data, raw_dtype=raw if data.dtype == np.uint8 else None)
            continue
        if GGMLQuantizationType(int(t.tensor_type)) != GGMLQuantizationType.F32:
            print(f"{t.name}: {GGMLQuantizationType(int(t.tensor_type)).name}, not F32", file=sys.stderr)
            return 1
        w.add_tensor(t.name, quantize(lib, data.reshape(shape), qtype, rng), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
