"""Engine-vs-numpy oracle helpers for tests/model (also usable from a shell for measurements).

The engine side runs in serve (mux) mode at temperature 0 with `logprobs=32`: each DATA line
carries the log-probabilities of the 32 most likely tokens, so the greedy token is the first id
and the first line gives the engine's first-step distribution. The numpy side is
native/tools/llama_ref.py (float64, dequantized weights, no activation quantization).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from tests.native.engine import Engine, base_env, parse_model_line
from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "native" / "tools"))
from llama_ref import Model  # noqa: E402

EOS = 2
K = 32  # the engine's maximum logprobs=k


@dataclass
class Gen:
    ids: list[int] = field(default_factory=list)        # greedy tokens (EOS not included)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # per step: (id, logprob) x K
    prompt_tokens: int = 0
    text: bytes = b""


def engine_greedy(binary, model, prompts: list[str], steps: int, timeout=120.0, **env) -> list[Gen]:
    """Greedy continuations of every prompt, submitted at once to distinct slots (batched decode)."""
    e = Engine(binary, env=base_env(model, slots=max(1, len(prompts)), ctx=512, **env))
    try:
        rids = [e.submit(p, slot=i, max_tokens=steps, extra=f" logprobs={K}") for i, p in enumerate(prompts)]
        out = []
        for rid in rids:
            r = e.result(rid, timeout)
            assert r.done is not None, f"request {rid} failed: {r.errors}"
            g = Gen(prompt_tokens=r.prompt_tokens, text=r.text)
            for kind, parts, _ in list(e.events):
                if kind != "DATA" or int(parts[1]) != rid or len(parts) < 5:
                    continue
                k = int(parts[4])
                pairs = [(int(parts[5 + 2 * i]), float(parts[6 + 2 * i])) for i in range(k)]
                assert abs(float(parts[3]) - pairs[0][1]) < 1e-3, f"greedy token is not the argmax: {parts[:8]}"
                g.ids.append(pairs[0][0])
                g.top.append(pairs)
            out.append(g)
        return out
    finally:
        _shutdown(e)


def engine_model_info(binary, model, **env) -> dict:
    """The MODEL handshake line's JSON (serve mode)."""
    e = Engine(binary, env=base_env(model, slots=1, ctx=64, **env))
    try:
        e.sync()
        return parse_model_line(e.latest["MODEL"])
    finally:
        _shutdown(e)


def _shutdown(e):
    try:
        e.close(10)
    finally:
        e.kill()


def log_softmax(x):
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@dataclass
class Compare:
    """Outcome of one prompt: where the token streams first differ (None = never) and the
    reference's top-1 / top-2 log-probability margin at that step."""
    n_same: int
    diverged_at: int | None
    ref_margin: float | None
    first_step_err: float    # max |engine - ref| log-prob over the engine's top-K at step 0
    max_step_err: float      # same, over every step before the first divergence


def compare(gen: Gen, ref_ids: list[int], ref_logits: list[np.ndarray]) -> Compare:
    ref_ids = [t for t in ref_ids if t != EOS]
    n = 0
    while n < min(len(gen.ids), len(ref_ids)) and gen.ids[n] == ref_ids[n]:
        n += 1
    diverged = None if (n == len(gen.ids) == len(ref_ids)) else n
    margin = None
    if diverged is not None and diverged < len(ref_logits):
        lp = np.sort(log_softmax(ref_logits[diverged]))[::-1]
        margin = float(lp[0] - lp[1])
    errs = []
    for s in range(min(n + (diverged is not None), len(gen.top), len(ref_logits))):
        lp = log_softmax(ref_logits[s])
        errs.append(max(abs(v - lp[i]) for i, v in gen.top[s]))
    return Compare(n, diverged, margin, errs[0] if errs else 0.0, max(errs) if errs else 0.0)


# ---------------------------------------------------------------- int8-activation reference
def quant_act(x: np.ndarray) -> np.ndarray:
    """The engine's activation quantization (native/src/quant.c quant_block), dequantized:
    per 32 values d = amax/127, q = round-half-away(x/d) clamped to ±127, in float32."""
    x = np.asarray(x, dtype=np.float32)
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127.0)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), np.float32(0.0)).astype(np.float32)
    v = b * inv
    q = np.clip(np.trunc(v + np.where(v >= 0, np.float32(0.5), np.float32(-0.5))), -127, 127)
    return (q * d).reshape(x.shape).astype(np.float64)


class QuantActModel(Model):
    """llama_ref.Model whose matmuls with Q8_0 / Q4_1 weights see the activations the way the
    engine does: the input quantized to int8 per 32-block (Q8_0: w·x_q; Q4_1 = d·q + m:
    (d·q)·x_q + m·Σx with the exact float sum). F32/F16 weights see x unchanged. With it,
    engine-vs-numpy differences shrink to float32 rounding (and the rare rounding-boundary
    flip), which is what the oracle test uses to tell arithmetic bugs from quantization noise."""

    def __init__(self, path, **kw):
        super().__init__(path, **kw)
        self._split: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}

    def _parts(self, name):
        if name not in self._split:
            t = self.t[name]
            qt = int(t.tensor_type)
            if qt == 2:  # Q4_0: not int8-split here (not used by our models)
                raise NotImplementedError("Q4_0")
            if qt == 3:  # Q4_1: blocks of f16 d, f16 m, 16 bytes of nibbles
                raw = np.asarray(t.data).reshape(-1, 20)
                d = raw[:, 0:2].copy().view(np.float16).astype(np.float64)
                m = raw[:, 2:4].copy().view(np.float16).astype(np.float64)
                qs = raw[:, 4:]
                q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
                shape = self.w(name).shape
                self._split[name] = ((d * q).reshape(shape), np.repeat(m, 32, axis=1).reshape(shape))
            elif qt == 8:  # Q8_0
                self._split[name] = (self.w(name), None)
            else:
                self._split[name] = None
        return self._split[name]

    def mm(self, x, name, e=None):
        """x @ W.T (W = the tensor, or its slice e for stacked experts)."""
        parts = self._parts(name)
        if parts is None:
            return super().mm(x, name, e)
        wq, wm = parts
        if e is not None:
            wq, wm = wq[e], (None if wm is None else wm[e])
        y = quant_act(x) @ wq.T
        if wm is not None:
            y = y + x @ wm.T
        return y


@dataclass
class Forced:
    """Engine greedy tokens scored by the reference (teacher-forced: one reference forward over
    prompt + engine tokens, so all steps are checked even after a near-tie)."""
    steps: int
    agree: int                   # steps where the engine token is the reference argmax
    worst_gap: float             # max over steps of (ref max logprob - ref logprob of engine token)
    first_step_err: float        # max |engine - ref| logprob over the engine's top-K, step 0
    max_step_err: float          # same, any step
    after: int = -1              # the reference argmax after the last engine token (EOS when
                                 # the engine's stream ended by EOS and the reference agrees)
    min_margin: float = 0.0      # smallest reference top-1 / top-2 log-prob margin, any step

    def __str__(self):
        return (f"{self.agree}/{self.steps} argmax-equal, worst gap {self.worst_gap:.4f}, "
                f"logprob err first {self.first_step_err:.2e} max {self.max_step_err:.2e}, "
                f"min margin {self.min_margin:.4f}, then {self.after}")


def forced(model: Model, prompt_ids: list[int], gen: Gen) -> Forced:
    ids = list(prompt_ids) + gen.ids
    logits = model.forward(ids)[len(prompt_ids) - 1:]
    agree, gap, errs, margin = 0, 0.0, [], np.inf
    for s, tok in enumerate(gen.ids):
        lp = log_softmax(logits[s])
        agree += int(np.argmax(lp) == tok)
        gap = max(gap, float(lp.max() - lp[tok]))
        errs.append(max(abs(v - lp[i]) for i, v in gen.top[s]))
        top2 = np.partition(lp, -2)[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
    return Forced(len(gen.ids), agree, gap, errs[0] if errs else 0.0, max(errs) if errs else 0.0,
                  int(np.argmax(logits[len(gen.ids)])), margin)
