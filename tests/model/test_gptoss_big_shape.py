"""The gpt-oss-20b / -120b-shaped generator (native/tools/make_gptoss_big.py) and the routing
profiles (native/tools/routing_profile.py).

The full files (12 / 63 GB) are never written here. The plan's arithmetic is held to what
llama.cpp printed for the real ggml-org files (tensor counts per type and total size); a 2-layer
file of the 20b shape with the realistic profile (2.1 GB, ~20 s) is read back with GGUFReader
(keys, tokenizer, template, every tensor's type, shape and byte range), its random blocks are
checked for the intended statistics, and the engine loads it and routes with the profile's
popularity curve. gguf >= 0.19 (MXFP4) is needed, as pyproject pins.
"""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from tests.model.route_probe import route_counts
from tests.native.engine import Engine, base_env
from tests.support.procs import ROOT
from tests.support.reference import chat_template

sys.path.insert(0, str(ROOT / "native" / "tools"))
import make_gptoss_big as gen  # noqa: E402
import routing_profile as rp  # noqa: E402

Q = GGMLQuantizationType
GEN = ROOT / "native" / "tools" / "make_gptoss_big.py"
LAYERS, EXPERTS = 2, 32


def type_counts(specs):
    out: dict[str, int] = {}
    for s in specs:
        out[s.qtype.name] = out.get(s.qtype.name, 0) + 1
    return out


@pytest.mark.parametrize("shape,counts,gib", [
    # llama.cpp's load log of ggml-org's gpt-oss-20b-mxfp4.gguf: f32 289, q8_0 98, mxfp4 72, 11.27 GiB
    ("20b", {"F32": 289, "Q8_0": 98, "MXFP4": 72}, 11.27),
    # llama-bench on ggml-org's gpt-oss-120b-mxfp4: 59.02 GiB (36 layers: 433 / 146 / 108 tensors)
    ("120b", {"F32": 433, "Q8_0": 146, "MXFP4": 108}, 59.02),
])
def test_plan_has_the_real_files_types_and_size(shape, counts, gib):
    layers, experts = gen.SHAPES[shape]
    specs = gen.plan(layers, experts)
    assert type_counts(specs) == counts
    block = {q: GGML_QUANT_SIZES[q] for q in (Q.F32, Q.Q8_0, Q.MXFP4)}
    total = sum(math.prod(s.shape) // block[s.qtype][0] * block[s.qtype][1] for s in specs)
    assert round(total / 2**30, 2) == gib
    # --attn-type bf16: only the 4 attention matrices per layer change type
    bf = type_counts(gen.plan(layers, experts, Q.BF16))
    assert bf == {"F32": counts["F32"], "Q8_0": 2, "BF16": 4 * layers, "MXFP4": counts["MXFP4"]}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("gptoss") / "gptoss20b-L2-realistic.gguf"
    subprocess.run([sys.executable, str(GEN), str(out), "--shape", "20b", "--layers", str(LAYERS),
                    "--profile", "realistic", "-q"], check=True)
    return out


@pytest.fixture(scope="module")
def reader(small):
    return GGUFReader(str(small))


def kv_scalar(kv, k):
    f = kv[k]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v[0]


def test_small_file_keys_tokenizer_and_tensors(small, reader):
    r = reader
    kv = {f.name: f for f in r.fields.values()}
    assert kv_scalar(kv, "general.architecture") == "gpt-oss"
    want = {"block_count": LAYERS, "context_length": 131072, "embedding_length": 2880, "feed_forward_length": 2880,
            "attention.head_count": 64, "attention.head_count_kv": 8, "attention.key_length": 64,
            "attention.value_length": 64, "attention.sliding_window": 128, "expert_count": EXPERTS,
            "expert_used_count": 4, "expert_feed_forward_length": 2880, "rope.scaling.original_context_length": 4096}
    for k, v in want.items():
        assert kv_scalar(kv, f"gpt-oss.{k}") == v, k
    assert kv_scalar(kv, "gpt-oss.rope.scaling.type") == "yarn"
    assert kv_scalar(kv, "gpt-oss.rope.scaling.factor") == pytest.approx(32.0)
    assert kv_scalar(kv, "gpt-oss.rope.freq_base") == pytest.approx(150000.0)
    assert kv_scalar(kv, "general.file_type") == 38
    assert kv_scalar(kv, "tokenizer.ggml.pre") == "gpt-4o"
    tokens = [bytes(kv["tokenizer.ggml.tokens"].parts[i]).decode() for i in kv["tokenizer.ggml.tokens"].data]
    types = [int(kv["tokenizer.ggml.token_type"].parts[i][0]) for i in kv["tokenizer.ggml.token_type"].data]
    assert len(tokens) == 201088 and len(set(tokens)) == 201088
    assert tokens[0] == "!"
    # o200k_harmony's ids
    for i, t in {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
                 200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>",
                 200012: "<|call|>", 200018: "<|endofprompt|>"}.items():
        assert tokens[i] == t and types[i] == 3, i
    assert set(types[:199998]) == {1} and set(types[200019:]) == {5}
    assert (kv_scalar(kv, "tokenizer.ggml.bos_token_id"), kv_scalar(kv, "tokenizer.ggml.eos_token_id"),
            kv_scalar(kv, "tokenizer.ggml.padding_token_id")) == (199998, 200002, 199999)
    merges = len(kv["tokenizer.ggml.merges"].data)
    assert merges == 199998 - 256        # one merge per multi-byte token
    assert kv_scalar(kv, "tokenizer.chat_template") == chat_template("openai-gpt-oss-120b.jinja")

    # every tensor: the type and shape of the real files, its bytes = values / block x block size
    want_t: dict[str, tuple[str, list[int]]] = {
        "token_embd.weight": ("Q8_0", [2880, 201088]), "output.weight": ("Q8_0", [2880, 201088]),
        "output_norm.weight": ("F32", [2880])}
    for i in range(LAYERS):
        p = f"blk.{i}."
        want_t.update({
            p + "attn_norm.weight": ("F32", [2880]), p + "post_attention_norm.weight": ("F32", [2880]),
            p + "attn_q.weight": ("Q8_0", [2880, 4096]), p + "attn_q.bias": ("F32", [4096]),
            p + "attn_k.weight": ("Q8_0", [2880, 512]), p + "attn_k.bias": ("F32", [512]),
            p + "attn_v.weight": ("Q8_0", [2880, 512]), p + "attn_v.bias": ("F32", [512]),
            p + "attn_output.weight": ("Q8_0", [4096, 2880]), p + "attn_output.bias": ("F32", [2880]),
            p + "attn_sinks.weight": ("F32", [64]),
            p + "ffn_gate_inp.weight": ("F32", [2880, EXPERTS]), p + "ffn_gate_inp.bias": ("F32", [EXPERTS]),
            p + "ffn_gate_exps.weight": ("MXFP4", [2880, 2880, EXPERTS]), p + "ffn_gate_exps.bias": ("F32", [2880, EXPERTS]),
            p + "ffn_up_exps.weight": ("MXFP4", [2880, 2880, EXPERTS]), p + "ffn_up_exps.bias": ("F32", [2880, EXPERTS]),
            p + "ffn_down_exps.weight": ("MXFP4", [2880, 2880, EXPERTS]), p + "ffn_down_exps.bias": ("F32", [2880, EXPERTS]),
        })
    got = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert got == want_t
    size = {"F32": (1, 4), "Q8_0": (32, 34), "MXFP4": (32, 17)}
    end = 0
    for t in sorted(r.tensors, key=lambda t: t.data_offset):
        blk, bs = size[t.tensor_type.name]
        assert t.n_bytes == math.prod(int(x) for x in t.shape) // blk * bs, t.name
        assert t.data_offset >= end
        end = t.data_offset + t.n_bytes
    assert end <= small.stat().st_size < end + 64


def rows_of(r, name, n=64):
    t = next(t for t in r.tensors if t.name == name)
    raw = np.array(t.data)
    return t, raw.reshape(-1, raw.shape[-1])[1000:1000 + n]


def test_random_blocks_have_the_intended_statistics(reader):
    r = reader
    for name, std in (("blk.1.ffn_gate_exps.weight", gen.GATE_UP_SCALE / math.sqrt(2880)),
                      ("blk.1.ffn_down_exps.weight", gen.DOWN_SCALE / math.sqrt(2880)),
                      ("blk.0.attn_q.weight", 1 / math.sqrt(2880)),
                      ("output.weight", gen.HEAD_SCALE / math.sqrt(2880))):
        t, rows = rows_of(r, name)
        x = dequantize(rows, t.tensor_type).astype(np.float64)
        assert np.isfinite(x).all()
        sd = x.std()
        assert abs(sd / std - 1) < 0.05, (name, sd, std)
        assert abs(x.mean()) < 0.02 * sd, name
    # MXFP4: the 16 e2m1 codes equally likely, the E8M0 byte one of two adjacent exponents
    t, rows = rows_of(r, "blk.0.ffn_up_exps.weight", 400)
    blocks = rows.reshape(-1, 17)
    e, _ = gen.mxfp4_exponent(gen.GATE_UP_SCALE / math.sqrt(2880))
    assert set(np.unique(blocks[:, 0]).tolist()) == {e, e + 1}
    codes = np.concatenate([blocks[:, 1:] & 15, blocks[:, 1:] >> 4]).ravel()
    hist = np.bincount(codes, minlength=16)
    chi2 = ((hist - hist.mean()) ** 2 / hist.mean()).sum()
    assert chi2 < 50, hist                      # 15 degrees of freedom: p < 1e-5 above 50


def test_profiles_popularity_in_simulation():
    # the fitted table reproduces the target curve for Gaussian router logits
    for n, k in rp.REALISTIC:
        got = rp.simulate(rp.rank_scales(n, k), k)
        tol = 0.035 if (n, k) == (32, 4) else 0.015      # this family's best at 32 x top-4: ~43/69/91
        assert np.abs(got - rp.TARGET).max() < tol, ((n, k), got)
    uni = rp.simulate(np.ones(128), 8)
    assert np.abs(uni - (0.125, 0.25, 0.5)).max() < 0.02, uni      # + sorting's bias at ~1,250 picks each
    # shapes outside the table are fitted on demand
    c, p = rp.fit(64, 4)
    assert np.abs(rp.simulate((1 + np.arange(64) / c) ** -p, 4) - rp.TARGET).max() < 0.04
    # a random ranking per layer: the same multiset of scales, in a different order per seed
    a = rp.row_scales("realistic", 32, 4, np.random.default_rng(1))
    b = rp.row_scales("realistic", 32, 4, np.random.default_rng(2))
    assert np.allclose(np.sort(a), np.sort(b)) and not np.allclose(a, b)
    assert (rp.row_scales("uniform", 32, 4, np.random.default_rng(1)) == 1).all()
    with pytest.raises(ValueError, match="unknown routing profile"):
        rp.row_scales("zipf", 32, 4, np.random.default_rng(1))


def test_engine_routes_the_small_file_with_the_realistic_curve(engine_binary, small):
    # the random-letter prompt: ~1,700 distinct-ish tokens, ~210 picks per expert and layer
    prompt_tokens, counts = route_counts(engine_binary, small, 180, 300, extra=" logprobs=3")
    assert counts.shape == (LAYERS, EXPERTS)
    assert prompt_tokens > 1000
    shares = rp.top_shares(counts)
    # measured 0.40-0.43 / 0.66-0.68 / 0.91-0.92 on this file (uniform routing: ~0.16 / 0.30 / 0.56)
    assert (np.abs(shares - rp.TARGET) < (0.07, 0.06, 0.05)).all(), shares


def _greedy_with_logprobs(engine_binary, model, **env):
    """Greedy text, the DATA headers' logprob fields and the DONE line's hit % of one turn."""
    e = Engine(engine_binary, env=base_env(model, slots=1, ctx=1024, **env), wait_ready=False)
    try:
        e.wait(lambda: e.ready, 180, "READY")
        r = e.result(e.submit(b"The rivers and bridges of the old city", max_tokens=12, extra=" logprobs=3"),
                     timeout=300)
        assert r.done is not None, r.errors
        tails = [parts[3:] for kind, parts, _ in list(e.events) if kind == "DATA" and int(parts[1]) == r.id]
    finally:
        e.close(timeout=120)
    return r.text, tails, r.stat()["hit_pct"]


def test_streamed_mxfp4_experts_give_the_resident_bits(engine_binary, small):
    """Under a budget the file's MXFP4 experts stay in its layout, read by O_DIRECT straight into
    their buffers and packed group by group as the tiles run; in RAM they are packed once at
    load; EXPERT_DIRECT=0 streams them through the page cache and packs them after each read.
    The three must give the same greedy tokens and the same logprob bits, and the budgeted runs
    must have read experts from disk."""
    ram = _greedy_with_logprobs(engine_binary, small)
    # 100 MB holds 7 of the 64 experts (13.2 MB each): nearly every selection is read
    direct = _greedy_with_logprobs(engine_binary, small, EXPERT_RAM_MB=100, PIN_MB=0)
    buffered = _greedy_with_logprobs(engine_binary, small, EXPERT_RAM_MB=100, PIN_MB=0, EXPERT_DIRECT=0)
    assert ram[2] == 100 and direct[2] < 90 and buffered[2] < 90, (ram[2], direct[2], buffered[2])
    assert len(ram[1]) == 12 and all(len(t) == 2 + 2 * 3 for t in ram[1]), ram[1][:2]
    assert direct[:2] == ram[:2]
    assert buffered[:2] == ram[:2]
