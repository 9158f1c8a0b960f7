"""kquant.py — simple K-quant encoders (Q4_K, Q6_K) in numpy, for test fixtures.

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
