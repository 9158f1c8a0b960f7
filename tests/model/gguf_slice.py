#!/usr/bin/env python3
"""Write a truncated copy of a llama GGUF: the first N transformer layers, everything else kept.

    gguf_slice.py IN.gguf OUT.gguf --layers N [--top-k K]

Metadata is copied as is except `llama.block_count` (= N) and, with --top-k, the MoE
`llama.expert_used_count` (= K; e.g. 16 = every expert active). Tensor bytes are copied raw
(no requantization), so the kept layers are bit-identical to the source. A test tool: the
oracle tests compare the engine with the numpy reference on such slices, because the numpy
forward of the full 30-layer model is too slow for CI.
"""
from __future__ import annotations

import argparse
import re
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter


def copy_writer(src, dst, override: dict | None = None):
    """(reader of src, a GGUFWriter for dst holding every key of src, its architecture): the one
    place that copies a GGUF's metadata; override's values replace the named keys' values. The
    caller adds the tensors and writes the file (write_out)."""
    r = GGUFReader(str(src))
    arch = r.fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    w = GGUFWriter(str(dst), arch)
    override = override or {}
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[-1]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, override.get(field.name, field.contents()), vtype, sub_type=sub)
    return r, w, arch


def add_raw(w, t):
    """Tensor t of a GGUFReader into writer w as stored (quantized blocks raw, floats as they are)."""
    data = np.asarray(t.data)
    w.add_tensor(t.name, data, raw_dtype=GGMLQuantizationType(int(t.tensor_type)) if data.dtype == np.uint8 else None)


def write_out(w, dst):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def slice_gguf(src, out, layers: int, top_k: int | None = None):
    fields = GGUFReader(str(src)).fields
    arch = bytes(fields["general.architecture"].parts[fields["general.architecture"].data[0]]).decode()
    override = {f"{arch}.block_count": layers}
    if top_k is not None:
        if f"{arch}.expert_count" not in fields:
            raise ValueError("--top-k given for a dense model")
        override[f"{arch}.expert_used_count"] = top_k
    r, w, _ = copy_writer(src, out, override)
    blk = re.compile(r"^blk\.(\d+)\.")
    for t in r.tensors:
        m = blk.match(t.name)
        if m and int(m.group(1)) >= layers:
            continue
        add_raw(w, t)
    return write_out(w, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--top-k", type=int)
    a = ap.parse_args(argv)
    slice_gguf(a.src, a.out, a.layers, a.top_k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
