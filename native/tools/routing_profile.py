"""routing_profile.py — the generators' named expert-routing profiles (make_gptoss_big.py,
make_qwen3moe_30b.py, make_qwen35moe_big.py).

Random-weight files route almost uniformly: every expert of a layer is picked about as often,
the worst case for an expert cache. Real MoE models do not: on gemma-4-26b-a4b (omlx PR #2595,
per-request hit rates of a resident fraction) a layer's hottest 12.5 / 25 / 50 % of experts take
about 45 / 67 / 89 % of the picks. The `realistic` profile reproduces that curve:

  each layer draws a random ranking of its experts, and the router row of the expert of rank r
  is scaled by s(r) = (1 + r / c)^-p.

A router logit is then ~ s(r)·z with z about N(0, σ²) over tokens (a random row against a
normalised hidden state), and top-k picks the experts whose logits reach furthest, so wider
experts are picked more often, for every token through its own hidden state (no constant bias).
(c, p) depend on the expert count and top-k; REALISTIC holds them fitted (a grid search of
`fit`, common random numbers) for the shapes the generators write: (128, 8) is Qwen3-30B-A3B's
and the reference note's (1 + rank/4)^-0.5; (32, 4) gpt-oss-20b's, where this family reaches
about 43 / 69 / 91 % at best (a scaled logit tops its median for half of the tokens only, so the
hottest 4 of 32 experts cannot take much more than half of top-4's picks); (128, 4)
gpt-oss-120b's; (256, 8) Qwen3.5 / Qwen3.6-35B-A3B's (make_qwen35moe_big.py; 44.6 / 67.8 / 88.6 %
in `simulate`, refined on a finer grid than `fit`'s). Other shapes are fitted on demand.
`uniform` scales nothing.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

PROFILES = ("uniform", "realistic")
RESIDENCIES = (0.125, 0.25, 0.5)
TARGET = (0.45, 0.67, 0.89)          # omlx PR #2595, gemma-4-26b-a4b
# (n_experts, top_k) -> (c, p) of s(r) = (1 + r/c)^-p
REALISTIC: dict[tuple[int, int], tuple[float, float]] = {
    (128, 8): (4.0, 0.5),
    (128, 4): (14.25, 0.46),
    (32, 4): (0.25, 1.06),
    (256, 8): (26.5, 0.44),
}


def top_shares(counts: np.ndarray) -> np.ndarray:
    """Per row of expert pick counts [rows, n_experts]: the share of the picks taken by the hottest
    12.5 / 25 / 50 % of the experts -> [rows, 3]."""
    c = np.sort(np.asarray(counts, dtype=np.float64), axis=-1)[..., ::-1]
    cs = np.cumsum(c, axis=-1) / np.maximum(c.sum(axis=-1, keepdims=True), 1e-300)
    n = c.shape[-1]
    return np.stack([cs[..., max(1, round(n * q)) - 1] for q in RESIDENCIES], axis=-1)


def simulate(scales: np.ndarray, top_k: int, tokens: int = 20000, seed: int = 1) -> np.ndarray:
    """Top-k selection over Gaussian logits scales·z for `tokens` draws: the popularity shares."""
    z = np.random.default_rng(seed).standard_normal((tokens, len(scales))) * scales
    sel = np.argpartition(-z, top_k, axis=1)[:, :top_k]
    return top_shares(np.bincount(sel.ravel(), minlength=len(scales)))


def _scales(n: int, c: float, p: float) -> np.ndarray:
    return (1.0 + np.arange(n) / c) ** -p


@lru_cache(maxsize=None)
def fit(n_experts: int, top_k: int) -> tuple[float, float]:
    """(c, p) whose simulated shares are nearest TARGET (max abs error), by a grid search."""
    if not 0 < top_k < n_experts:
        raise ValueError(f"top_k {top_k} must be in 1..{n_experts - 1}")
    z = np.random.default_rng(0).standard_normal((4000, n_experts))
    best = (np.inf, 1.0, 0.5)
    for p in np.arange(0.3, 2.01, 0.04):
        for c in np.geomspace(0.1, 32.0, 24):
            s = _scales(n_experts, float(c), float(p))
            sel = np.argpartition(-(z * s), top_k, axis=1)[:, :top_k]
            err = float(np.abs(top_shares(np.bincount(sel.ravel(), minlength=n_experts)) - TARGET).max())
            if err < best[0]:
                best = (err, float(c), float(p))
    return best[1], best[2]


def params(n_experts: int, top_k: int) -> tuple[float, float]:
    return REALISTIC.get((n_experts, top_k)) or fit(n_experts, top_k)


def rank_scales(n_experts: int, top_k: int) -> np.ndarray:
    """s(r) for ranks 0..n-1 of the realistic profile (hottest first)."""
    return _scales(n_experts, *params(n_experts, top_k))


def row_scales(profile: str, n_experts: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """Per expert (file order) the factor its router row is multiplied by: ones for `uniform`; for
    `realistic`, s(rank) over a random ranking drawn from rng."""
    if profile == "uniform":
        return np.ones(n_experts)
    if profile != "realistic":
        raise ValueError(f"unknown routing profile {profile!r} (known: {', '.join(PROFILES)})")
    out = np.empty(n_experts)
    out[rng.permutation(n_experts)] = rank_scales(n_experts, top_k)
    return out
