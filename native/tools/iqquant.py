"""iqquant.py — simple encoders for llama.cpp's grid IQ types (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S) in numpy, for test fixtures.

gguf's Python package dequantizes these types but does not quantize them. These encoders write
valid super-blocks in llama.cpp's layouts (ggml-common.h's block_iq2_xxs ...; the field order
native/src/quant_iqlow.c describes) with a plain rounding: per block a scale from its largest
magnitude, each group of 8 (IQ3: 4) values the grid row nearest to it (no importance matrix, no
search over scales, as llama.cpp's quantizer does): fixtures need the layout, not the last bit of
accuracy. The grids are gguf-py's own. Deterministic: same input, same bytes.
"""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import _type_traits

QK_K = 256


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _grid(qtype) -> np.ndarray:
    cls = _type_traits[qtype]
    cls.init_grid()
    return np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)


def _nearest(groups: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid row nearest (L2) to each row of groups [n, w]."""
    out = np.empty(len(groups), dtype=np.int64)
    g2 = (grid * grid).sum(axis=1)
    for i in range(0, len(groups), 2048):
        c = groups[i:i + 2048]
        out[i:i + 2048] = (g2[None, :] - 2.0 * c @ grid.T).argmin(axis=1)
    return out


def _ratio(x, s):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(s > 0, x / s, 0.0).astype(np.float32)


def _signs8(x8: np.ndarray, even: bool) -> np.ndarray:
    """Sign bits of groups [n, 8] (bit k: value k negative); even: an even number of them (the 7-bit
    fields with implied parity), flipping the smallest magnitude's sign where the count is odd."""
    neg = x8 < 0
    if even:
        odd = neg.sum(axis=1) % 2 == 1
        k = np.abs(x8).argmin(axis=1)
        neg[np.arange(len(x8)), k] ^= odd
    return (neg.astype(np.uint32) << np.arange(8, dtype=np.uint32)).sum(axis=1).astype(np.uint32)


def _scales(amax, top, gmax, step_of):
    """Per-unit scales: d (f16, per super-block [sb]) and the integer scale codes ls [sb, u] in 0..top
    with unit scale step_of(d, ls) ~ amax / gmax."""
    want = amax / gmax                                            # [sb, u]
    d = _f16(want.max(axis=1) / step_of(1.0, top))
    df = d.astype(np.float32)[:, None]
    cand = np.arange(top + 1)
    err = np.abs(step_of(df[..., None], cand[None, None, :]) - want[..., None])
    return d, err.argmin(axis=-1).astype(np.int64)


def _iq2_iq3(x: np.ndarray, qtype) -> np.ndarray:
    shape = x.shape
    sb = np.asarray(x, dtype=np.float32).reshape(-1, QK_K)
    n = len(sb)
    grid = _grid(qtype)
    w = grid.shape[1]
    half = qtype in (T.IQ2_XS, T.IQ2_S)                     # a scale per 16 values, else per 32
    unit = 16 if half else 32
    amax = np.abs(sb).reshape(n, -1, unit).max(axis=2)
    if qtype == T.IQ3_S:
        def step(d, ls):
            return d * (1 + 2 * np.asarray(ls, dtype=np.float32))
    else:
        k = 0.5 if qtype == T.IQ3_XXS else 0.25

        def step(d, ls):
            return d * (0.5 + np.asarray(ls, dtype=np.float32)) * k
    d, ls = _scales(amax, 15, grid.max(), step)
    db = step(d.astype(np.float32)[:, None], ls)                  # [n, units]
    y = _ratio(np.abs(sb).reshape(n, -1, unit), db[..., None]).reshape(-1, w)
    idx = _nearest(y, grid).reshape(n, -1)                        # [n, 256 / w]
    even = qtype in (T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS)
    sg = _signs8(sb.reshape(-1, 8), even).reshape(n, 32)          # [n, 32 groups of 8]
    dd = d.reshape(-1, 1).view(np.uint8)
    if qtype == T.IQ2_XXS:
        a0 = (idx.reshape(n, 8, 4).astype(np.uint32) << (8 * np.arange(4, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
        a1 = ((sg.reshape(n, 8, 4) & 127) << (7 * np.arange(4, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
        a1 |= ls.astype(np.uint32) << 28
        body = np.stack([a0, a1], axis=2).reshape(n, 16).view(np.uint8)
    elif qtype == T.IQ2_XS:
        qs = (idx.astype(np.uint16) | ((sg & 127).astype(np.uint16) << 9)).view(np.uint8)
        body = np.concatenate([qs, (ls[:, 0::2] | ls[:, 1::2] << 4).astype(np.uint8)], axis=1)
    elif qtype == T.IQ2_S:
        qh = ((idx >> 8).reshape(n, 8, 4) << (2 * np.arange(4))).sum(axis=2).astype(np.uint8)
        body = np.concatenate([(idx & 255).astype(np.uint8), sg.astype(np.uint8), qh,
                               (ls[:, 0::2] | ls[:, 1::2] << 4).astype(np.uint8)], axis=1)
    elif qtype == T.IQ3_XXS:
        sc = ((sg.reshape(n, 8, 4) & 127) << (7 * np.arange(4, dtype=np.uint32))).sum(axis=2, dtype=np.uint32)
        sc |= ls.astype(np.uint32) << 28
        body = np.concatenate([idx.astype(np.uint8), sc.view(np.uint8)], axis=1)
    else:   # IQ3_S
        qh = ((idx >> 8).reshape(n, 8, 8) << np.arange(8)).sum(axis=2).astype(np.uint8)
        body = np.concatenate([(idx & 255).astype(np.uint8), qh, sg.astype(np.uint8),
                               (ls[:, 0::2] | ls[:, 1::2] << 4).astype(np.uint8)], axis=1)
    out = np.concatenate([dd, body], axis=1)
    return out.reshape(*shape[:-1], -1)


def _iq1(x: np.ndarray, qtype) -> np.ndarray:
    shape = x.shape
    sb = np.asarray(x, dtype=np.float32).reshape(-1, QK_K)
    n = len(sb)
    grid = _grid(qtype)                                           # values -1, 0, 1
    unit = 16 if qtype == T.IQ1_M else 32
    amax = np.abs(sb).reshape(n, -1, unit).max(axis=2)

    def step(d, ls):
        return d * (2 * np.asarray(ls, dtype=np.float32) + 1)
    d, ls = _scales(amax, 7, 1.125, step)
    dl = step(d.astype(np.float32)[:, None], ls)                  # [n, units]
    y = _ratio(sb.reshape(n, -1, unit), dl[..., None])
    dunit = 8 if qtype == T.IQ1_M else 32                         # one delta sign per group / per block
    dneg = y.reshape(n, -1, dunit).mean(axis=2) < 0               # [n, 32 or 8]
    delta = np.where(dneg, -0.125, 0.125).astype(np.float32)
    yd = (y.reshape(n, -1, dunit) - delta[..., None]).reshape(-1, 8)
    idx = _nearest(yd, grid).reshape(n, 32)
    if qtype == T.IQ1_S:
        qh = ((idx >> 8).reshape(n, 8, 4) << (3 * np.arange(4))).sum(axis=2)
        qh = (qh | ls << 12 | dneg.astype(np.int64) << 15).astype(np.uint16)
        out = np.concatenate([d.reshape(-1, 1).view(np.uint8), (idx & 255).astype(np.uint8), qh.view(np.uint8)], axis=1)
    else:
        nib = (idx >> 8) | dneg.astype(np.int64) << 3             # [n, 32] groups
        qh = (nib[:, 0::2] | nib[:, 1::2] << 4).astype(np.uint8)   # [n, 16]
        sc = (ls.reshape(n, 4, 4) << (3 * np.arange(4))).sum(axis=2)
        dbits = d.view(np.uint16).astype(np.int64)
        sc |= ((dbits[:, None] >> (4 * np.arange(4))) & 15) << 12
        out = np.concatenate([(idx & 255).astype(np.uint8), qh, sc.astype(np.uint16).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], -1)


ENCODERS = {name: (lambda x, q=T[name]: _iq2_iq3(x, q)) for name in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")}
ENCODERS.update({name: (lambda x, q=T[name]: _iq1(x, q)) for name in ("IQ1_S", "IQ1_M")})
