"""RoPE scaling (issue 15 item 1: "YaRN/rope scaling where those files use it"): a file whose
<arch>.rope.scaling.* keys ask for linear or YaRN scaling runs with it, against a float64 reference
of the published definition; kinds the engine does not implement are refused with one line.

Keys, as llama.cpp reads them: rope.scaling.type (none | linear | yarn; linear is the default when
only a factor is given), rope.scaling.factor (or the older rope.scale_linear), attn_factor,
original_context_length (else context_length), yarn_beta_fast / yarn_beta_slow (32 / 1).

Reference: transformers' _compute_yarn_parameters (modeling_rope_utils), written out here with the
factor and the original context taken from the file as llama.cpp does: pos_freqs = base^(2i/d);
inv_freq = interpolation (1 / (factor pos_freqs)) x (1 - e_i) + extrapolation (1 / pos_freqs) x e_i,
e_i = 1 - linear_ramp(low, high)_i with low = floor(d ln(orig / (32 2 pi)) / (2 ln base)) (>= 0),
high = ceil(... 1 ...) (<= d - 1); cos/sin x attention_factor = 0.1 ln(factor) + 1. Linear:
inv_freq / factor. Applied to the architecture references of arch_ref.py (NeoX or interleaved
pairs as each file's architecture), teacher-forced as test_arch_oracle.py: EXACT=1, KV f32.
Measured (2026-12-01): greedy 12/12 on every case, max |d log-prob| qwen3moe YaRN 4.1e-6, olmoe
YaRN 5.5e-6, granitemoe YaRN 3.4e-7, qwen2moe linear 3.9e-6 (bar 2e-3, the oracle's); the unscaled
files differ from these references by 4.5 .. 4.7 (granitemoe: 1.8e-3, its log-probs are flat).
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from gguf import GGUFValueType

from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.model.gguf_slice import add_raw, copy_writer, write_out
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
STEPS = 12
TOL = 2e-3
YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64}
LINEAR = {"rope.scaling.type": "linear", "rope.scaling.factor": 2.0}


def fixture(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    if not path.exists():
        procs.make_arch_fixture(path, arch)
    return path


def with_keys(src, dst, keys: dict, tensors: dict | None = None):
    """A copy of src with <arch>.<key> = value added (str, float or int values) and the given F32
    tensors added; the file's own tensors unchanged."""
    r, w, arch = copy_writer(src, dst)
    for k, v in keys.items():
        vt = GGUFValueType.STRING if isinstance(v, str) else GGUFValueType.FLOAT32 if isinstance(v, float) \
            else GGUFValueType.UINT32
        w.add_key_value(f"{arch}.{k}", v, vt)
    for t in r.tensors:
        add_raw(w, t)
    for name, arr in (tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    return write_out(w, dst)


def scaled_inv_freq(base, d, keys):
    """(inv_freq [d/2], cos/sin factor) of the published definitions for these keys."""
    pos_freqs = base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    factor = keys["rope.scaling.factor"]
    if keys["rope.scaling.type"] == "linear":
        return 1.0 / (factor * pos_freqs), 1.0
    orig = keys["rope.scaling.original_context_length"]

    def correction_dim(rotations):
        return d * np.log(orig / (rotations * 2 * np.pi)) / (2 * np.log(base))

    low, high = max(np.floor(correction_dim(32)), 0), min(np.ceil(correction_dim(1)), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return inv, 0.1 * np.log(factor) + 1.0


def scaled_ref(arch, path, keys):
    base_cls = REFS[arch]

    class Scaled(base_cls):
        def rope(self, x, pos):
            d = self.RD
            inv, mscale = scaled_inv_freq(self.base, d, keys)
            ang = pos[:, None] * inv[None, :]
            cos, sin = (np.cos(ang) * mscale)[:, None, :], (np.sin(ang) * mscale)[:, None, :]
            out = x.copy()
            if self.neox:
                a, b = x[..., : d // 2], x[..., d // 2:d]
                out[..., : d // 2], out[..., d // 2:d] = a * cos - b * sin, b * cos + a * sin
            else:
                a, b = x[..., 0:d:2], x[..., 1:d:2]
                out[..., 0:d:2], out[..., 1:d:2] = a * cos - b * sin, a * sin + b * cos
            return out

    return Scaled(str(path))


def engine_lp(fwd_dump, model, ids, vocab, tmp_path):
    out = tmp_path / "logits.f32"
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True,
                   env=dict(os.environ, EXACT="1", KV_TYPE="f32"))
    return log_softmax(np.fromfile(out, dtype=np.float32).reshape(len(ids), vocab).astype(np.float64))


def worst(ref_lp, lp, ids):
    """(greedy agreement, max |d log-prob| over the reference's top 32) along the continuation."""
    agree, err = 0, 0.0
    for pos in range(len(PROMPT) - 1, len(ids) - 1):
        agree += int(np.argmax(lp[pos]) == ids[pos + 1])
        top = np.argsort(-ref_lp[pos])[:32]
        err = max(err, float(np.abs(ref_lp[pos, top] - lp[pos, top]).max()))
    return agree, err


@pytest.mark.parametrize("arch,kind", [("qwen3moe", "yarn"), ("granitemoe", "yarn"), ("olmoe", "yarn"),
                                       ("qwen2moe", "linear")])
def test_rope_scaling_matches_reference(arch, kind, fwd_dump, tmp_path):
    """qwen3moe: NeoX pairs, head_dim 128; granitemoe: interleaved pairs; olmoe: NeoX, base 1e4."""
    keys = YARN if kind == "yarn" else LINEAR
    plain = fixture(tmp_path, arch)
    scaled = with_keys(plain, tmp_path / f"{arch}-{kind}.gguf", keys)
    ref = scaled_ref(arch, scaled, keys)
    ids = greedy(ref, PROMPT, STEPS)
    ref_lp = log_softmax(ref.forward(ids))
    vocab = ref_lp.shape[1]
    agree, err = worst(ref_lp, engine_lp(fwd_dump, scaled, ids, vocab, tmp_path), ids)
    _, effect = worst(ref_lp, engine_lp(fwd_dump, plain, ids, vocab, tmp_path), ids)
    print(f"{arch} {kind}: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}; unscaled file differs by {effect:.2f}")
    assert agree == STEPS and err <= TOL, f"{arch} {kind}: greedy {agree}/{STEPS}, err {err:.3g}"
    # the keys take effect: the unscaled file is far from this reference (granitemoe's log-probs
    # are flat, its logits divided by 6: 1.8e-3 there, against 3e-7 for the scaled file)
    assert effect > 50 * max(err, 1e-5), f"{arch} {kind}: the scaling keys change nothing ({effect:.3g})"


def test_rope_scaling_none_and_factor_one_change_nothing(fwd_dump, tmp_path):
    plain = fixture(tmp_path, "qwen3moe")
    ids = PROMPT + [3, 4, 5]
    want = engine_lp(fwd_dump, plain, ids, 459, tmp_path)
    for i, keys in enumerate(({"rope.scaling.type": "none", "rope.scaling.factor": 4.0},
                              {"rope.scaling.type": "linear", "rope.scaling.factor": 1.0},
                              {"rope.scaling.factor": 0.0})):
        got = engine_lp(fwd_dump, with_keys(plain, tmp_path / f"same{i}.gguf", keys), ids, 459, tmp_path)
        assert np.array_equal(got, want), keys


@pytest.mark.parametrize("keys,named", [
    ({"rope.scaling.type": "longrope", "rope.scaling.factor": 4.0}, "qwen3moe.rope.scaling.type 'longrope'"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.yarn_log_multiplier": 0.1},
     "qwen3moe.rope.scaling.yarn_log_multiplier"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": -2.0}, "qwen3moe.rope.scaling.factor"),
])
def test_unsupported_rope_scaling_refused(keys, named, engine_binary, tmp_path):
    bad = with_keys(fixture(tmp_path, "qwen3moe"), tmp_path / "bad.gguf", keys)
    p = subprocess.run([str(engine_binary), "-m", str(bad), "-p", "hi", "-n", "1"], capture_output=True, text=True,
                       timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 3 and lines and named in lines[-1], (p.returncode, p.stderr[-500:])


def llama3_inv_freq(base, d, factor=8.0, low=1.0, high=4.0, orig=64):
    """transformers' _compute_llama3_parameters: inv_freq of Llama 3.1's "llama3" rope_type."""
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return np.where(medium, mid, scaled)


def test_rope_freqs_llama(fwd_dump, tmp_path):
    """Llama 3.1+ files carry their "llama3" RoPE scaling as rope_freqs.weight: per pair, the divisor
    llama.cpp's converter wrote (1 for short wavelengths, factor for long ones, smooth between);
    the engine divides each pair's angle by it. Reference: llama_ref.py's forward with transformers'
    llama3 inv_freq (original context 64 so the short prompts reach the scaled pairs)."""
    from tests.model.oracle import Model      # native/tools/llama_ref.py
    from tests.support import procs

    plain = procs.make_tiny_model(tmp_path / "llama-f32.gguf", "--f32")
    ref0 = Model(str(plain))
    d, base = ref0.head_dim, ref0.rope_base
    inv = llama3_inv_freq(base, d)
    divisors = (1.0 / base ** (np.arange(0, d, 2) / d)) / inv      # what the converter stores
    path = with_keys(plain, tmp_path / "llama-rope-freqs.gguf", {}, {"rope_freqs.weight": divisors})

    class Llama3(Model):
        def rope(self, x, pos):
            ang = pos[:, None] * inv[None, :]
            c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
            out = np.empty_like(x)
            out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
            out[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
            return out

    ref = Llama3(str(path))
    ids, _ = ref.greedy(PROMPT, STEPS)
    ids = PROMPT + ids
    ref_lp = log_softmax(ref.forward(ids))
    vocab = ref_lp.shape[1]
    agree, err = worst(ref_lp, engine_lp(fwd_dump, path, ids, vocab, tmp_path), ids)
    _, effect = worst(ref_lp, engine_lp(fwd_dump, plain, ids, vocab, tmp_path), ids)
    print(f"llama rope_freqs: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}; plain file {effect:.2f}")
    assert agree == STEPS and err <= TOL, f"greedy {agree}/{STEPS}, err {err:.3g}"
    assert effect > 50 * max(err, 1e-5), f"rope_freqs.weight changes nothing ({effect:.3g})"
