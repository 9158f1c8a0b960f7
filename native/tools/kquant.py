"""kquant.py — simple K-quant (Q2_K .. Q6_K) and IQ4_NL / IQ4_XS encoders in numpy, for test fixtures.

gguf's Python package dequantizes K-quants but does not quantize them. These encoders write
valid blocks in llama.cpp's exact layouts (block_q4_K, block_q6_K of ggml-common.h) with a plain
min/max rounding (not llama.cpp's search for the best scales): fixtures need the layout, not the
last bit of accuracy. Deterministic: same input, same bytes.
"""
from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quant_q4_k(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n % 256 == 0) -> [..., n // 256 * 144] uint8."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 8, 32)           # super-blocks x sub-blocks x 32
    mn = np.minimum(b.min(axis=-1), 0.0)
    mx = b.max(axis=-1)
    scale = (mx - mn) / 15.0
    minv = -mn
    d = _f16(scale.max(axis=-1) / 63.0)
    dmin = _f16(minv.max(axis=-1) / 63.0)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmf[:, None] > 0, np.rint(minv / dmf[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = df[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] > 0, np.rint((b + (dmf[:, None] * m)[..., None]) / step[..., None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(-1, 256)
    s = np.zeros((len(b), 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    qs = np.zeros((len(b), 128), dtype=np.uint8)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = q[:, 64 * c:64 * c + 32] | (q[:, 64 * c + 32:64 * c + 64] << 4)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), s, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


def quant_q6_k(x: np.ndarray) -> np.ndarray:
    """[..., n] float32 (n % 256 == 0) -> [..., n // 256 * 210] uint8."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 16, 16)
    scale = np.abs(b).max(axis=-1) / 31.0
    d = _f16(scale.max(axis=-1) / 127.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(-128, 127).astype(np.int8)
        step = df[:, None] * sc.astype(np.float32)
        q = np.where(step[..., None] != 0, np.rint(b / step[..., None]), 0)
    u = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(-1, 256)
    ql = np.zeros((len(b), 128), dtype=np.uint8)
    qh = np.zeros((len(b), 64), dtype=np.uint8)
    for c in range(2):
        for h in range(2):
            ql[:, 64 * c:64 * c + 64] |= (u[:, 128 * c + 64 * h:128 * c + 64 * h + 64] & 15) << (4 * h)
        for s in range(4):
            qh[:, 32 * c:32 * c + 32] |= (u[:, 128 * c + 32 * s:128 * c + 32 * s + 32] >> 4) << (2 * s)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.reshape(-1, 1).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)


def _minmax_scales(b, levels):
    """Per sub-block (last axis) scale and min for unsigned codes 0..levels (value = s q - m)."""
    mn = np.minimum(b.min(axis=-1), 0.0)
    return (b.max(axis=-1) - mn) / levels, -mn


def _codes(b, step, minv, lo, hi):
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint((b + minv[..., None]) / step[..., None]), 0)
    return q.clip(lo, hi)


def quant_q5_k(x: np.ndarray) -> np.ndarray:
    """[..., n] -> [..., n // 256 * 176]: block_q5_K (d, dmin, Q4_K's 12 scale bytes, qh[32], qs[128])."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 8, 32)
    scale, minv = _minmax_scales(b, 31.0)
    d, dmin = _f16(scale.max(axis=-1) / 63.0), _f16(minv.max(axis=-1) / 63.0)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmf[:, None] > 0, np.rint(minv / dmf[:, None]), 0).clip(0, 63).astype(np.uint8)
    q = _codes(b, df[:, None] * sc, dmf[:, None] * m, 0, 31).astype(np.uint8).reshape(-1, 256)
    s = np.zeros((len(b), 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    qh = np.zeros((len(b), 32), dtype=np.uint8)
    for j in range(8):
        qh |= ((q[:, 32 * j:32 * j + 32] >> 4) & 1) << j
    qs = np.zeros((len(b), 128), dtype=np.uint8)
    for c in range(4):
        qs[:, 32 * c:32 * c + 32] = (q[:, 64 * c:64 * c + 32] & 15) | ((q[:, 64 * c + 32:64 * c + 64] & 15) << 4)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8), s, qh, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 176)


def quant_q3_k(x: np.ndarray) -> np.ndarray:
    """[..., n] -> [..., n // 256 * 110]: block_q3_K (hmask[32], qs[64], 12 scale bytes, d)."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 16, 16)
    scale = np.abs(b).max(axis=-1) / 4.0
    d = _f16(scale.max(axis=-1) / 31.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(-32, 31).astype(np.int32)
        step = df[:, None] * sc
        q = np.where(step[..., None] != 0, np.rint(b / step[..., None]), 0)
    u = (q.clip(-4, 3) + 4).astype(np.uint8).reshape(-1, 256)      # q = u - 4
    hmask = np.zeros((len(b), 32), dtype=np.uint8)
    qs = np.zeros((len(b), 64), dtype=np.uint8)
    for c in range(2):
        for s_ in range(4):
            v = u[:, 128 * c + 32 * s_:128 * c + 32 * s_ + 32]
            qs[:, 32 * c:32 * c + 32] |= (v & 3) << (2 * s_)
            hmask |= ((v >> 2) & 1) << (4 * c + s_)
    sb = (sc + 32).astype(np.uint8)                                 # 6-bit, offset 32
    scales = np.zeros((len(b), 12), dtype=np.uint8)
    scales[:, 0:8] = (sb[:, 0:8] & 15) | ((sb[:, 8:16] & 15) << 4)
    for k in range(16):
        scales[:, 8 + (k & 3)] |= ((sb[:, k] >> 4) & 3) << (2 * (k >> 2))
    out = np.concatenate([hmask, qs, scales, d.reshape(-1, 1).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 110)


def quant_q2_k(x: np.ndarray) -> np.ndarray:
    """[..., n] -> [..., n // 256 * 84]: block_q2_K (scales[16] = sc | m << 4, qs[64], d, dmin)."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 16, 16)
    scale, minv = _minmax_scales(b, 3.0)
    d, dmin = _f16(scale.max(axis=-1) / 15.0), _f16(minv.max(axis=-1) / 15.0)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(0, 15).astype(np.uint8)
        m = np.where(dmf[:, None] > 0, np.rint(minv / dmf[:, None]), 0).clip(0, 15).astype(np.uint8)
    q = _codes(b, df[:, None] * sc, dmf[:, None] * m, 0, 3).astype(np.uint8).reshape(-1, 256)
    qs = np.zeros((len(b), 64), dtype=np.uint8)
    for c in range(2):
        for s_ in range(4):
            qs[:, 32 * c:32 * c + 32] |= q[:, 128 * c + 32 * s_:128 * c + 32 * s_ + 32] << (2 * s_)
    out = np.concatenate([sc | (m << 4), qs, d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 84)


# IQ4_NL / IQ4_XS: 4-bit codes into llama.cpp's fixed non-linear table (kvalues_iq4nl)
IQ4_KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)


def _table_codes(b, step):
    """Codes 0..15 of b / step, each the nearest table entry (step 0: code of the value nearest 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(step[..., None] != 0, b / step[..., None], 0.0)
    return np.abs(v[..., None] - IQ4_KVALUES).argmin(axis=-1).astype(np.uint8)


def _nibbles(q):
    """[..., 32] codes -> [..., 16] bytes: value i in the low nibble of byte i, value 16 + i in the high."""
    return q[..., :16] | (q[..., 16:] << 4)


def quant_iq4_nl(x: np.ndarray) -> np.ndarray:
    """[..., n] (n % 32 == 0) -> [..., n // 32 * 18]: block_iq4_nl (f16 d, qs[16]); the block's
    largest magnitude lands on the table's end -127 (d of its sign flipped)."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    amax_at = np.abs(b).argmax(axis=-1)
    d = _f16(-b[np.arange(len(b)), amax_at] / 127.0)
    q = _table_codes(b, d.astype(np.float32))
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), _nibbles(q)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // 32 * 18)


def quant_iq4_xs(x: np.ndarray) -> np.ndarray:
    """[..., n] (n % 256 == 0) -> [..., n // 256 * 136]: block_iq4_xs (f16 d, u16 scales_h,
    u8 scales_l[4], qs[128]); block scale d * (ls - 32) with the 6-bit ls, the super-block's d
    from its largest block scale (IQ4_NL's rule per block, then rounded to d's grid)."""
    shape = x.shape
    b = np.asarray(x, dtype=np.float32).reshape(-1, 8, 32)
    amax_at = np.abs(b).argmax(axis=-1)
    scale = -np.take_along_axis(b, amax_at[..., None], axis=-1)[..., 0] / 127.0    # [sb, 8]
    d = _f16(np.abs(scale).max(axis=-1) / 32.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.where(df[:, None] > 0, np.rint(scale / df[:, None]), 0).clip(-32, 31).astype(np.int32) + 32
    q = _table_codes(b, df[:, None] * (ls - 32).astype(np.float32))
    scales_l = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)        # [sb, 4]
    scales_h = np.zeros(len(b), dtype=np.uint16)
    for j in range(8):
        scales_h |= ((ls[:, j] >> 4) & 3).astype(np.uint16) << (2 * j)
    out = np.concatenate([d.reshape(-1, 1).view(np.uint8), scales_h.reshape(-1, 1).view(np.uint8), scales_l,
                          _nibbles(q).reshape(len(b), 128)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 136)
