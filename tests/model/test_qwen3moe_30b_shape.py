"""The Qwen3-30B-A3B-shaped generator (native/tools/make_qwen3moe_30b.py, issue 23 item 2) on its
2-layer sibling: the tensor types and shapes of llama.cpp's Q4_K_M rules for that shape, the engine
loading it and generating with finite, varied log-probs, and --skew moving the engine's own expert
usage counts from near-uniform to a quarter of the experts taking about half the picks, and
--profile realistic to routing_profile's curve (hottest 12.5 / 25 / 50 % ~ 45 / 67 / 89 %).

The full 48-layer file (17 GiB) is never needed here: bench/scale.py uses it. ~30 s on a 2-core box
(two 1.1 GiB files written into tmp_path, two engine runs with an ~850-token prompt).
"""
from __future__ import annotations

import math
import random
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader

from tests.native.engine import Engine, base_env
from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "native" / "tools"))
import routing_profile as rp  # noqa: E402
from make_arch_fixture import use_more_bits  # noqa: E402

LAYERS = 2
GEN = ROOT / "native" / "tools" / "make_qwen3moe_30b.py"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("q30b")
    out = {}
    for name, extra in (("uniform", []), ("skew", ["--skew", "0.55"]), ("realistic", ["--profile", "realistic"])):
        out[name] = d / f"q30b-L{LAYERS}-{name}.gguf"
        subprocess.run([sys.executable, str(GEN), str(out[name]), "--layers", str(LAYERS), "-q", *extra], check=True)
    return out


def test_more_bits_layers_of_the_48_layer_file():
    # shared/reference/moe-ggufs.md §8: n = 48 -> layers 0-5, 8, 11, ..., 41, 42-47
    assert [i for i in range(48) if use_more_bits(i, 48)] == [*range(6), *range(8, 42, 3), *range(42, 48)]


def test_types_and_shapes_follow_q4_k_m(files):
    r = GGUFReader(str(files["uniform"]))
    kv = {f.name: f for f in r.fields.values()}

    def scalar(k):
        f = kv[k]
        return f.parts[f.data[0]][0]

    assert bytes(kv["general.architecture"].parts[-1]).decode() == "qwen3moe"
    assert scalar("qwen3moe.block_count") == LAYERS
    assert scalar("qwen3moe.embedding_length") == 2048
    assert (scalar("qwen3moe.attention.head_count"), scalar("qwen3moe.attention.head_count_kv")) == (32, 4)
    assert scalar("qwen3moe.attention.key_length") == 128
    assert (scalar("qwen3moe.expert_count"), scalar("qwen3moe.expert_used_count")) == (128, 8)
    assert scalar("qwen3moe.expert_feed_forward_length") == 768
    assert scalar("general.file_type") == 15
    assert len(kv["tokenizer.ggml.tokens"].data) == 151936
    assert len(kv["tokenizer.ggml.merges"].data) > 150000

    got = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    want = {"token_embd.weight": ("Q4_K", [2048, 151936]), "output_norm.weight": ("F32", [2048]),
            "output.weight": ("Q6_K", [2048, 151936])}
    for i in range(LAYERS):
        more = "Q6_K" if use_more_bits(i, LAYERS) else "Q4_K"
        p = f"blk.{i}."
        want.update({
            p + "attn_norm.weight": ("F32", [2048]), p + "ffn_norm.weight": ("F32", [2048]),
            p + "attn_q.weight": ("Q4_K", [2048, 4096]), p + "attn_k.weight": ("Q4_K", [2048, 512]),
            p + "attn_v.weight": (more, [2048, 512]), p + "attn_output.weight": ("Q4_K", [4096, 2048]),
            p + "attn_q_norm.weight": ("F32", [128]), p + "attn_k_norm.weight": ("F32", [128]),
            p + "ffn_gate_inp.weight": ("F32", [2048, 128]),
            p + "ffn_gate_exps.weight": ("Q4_K", [2048, 768, 128]), p + "ffn_up_exps.weight": ("Q4_K", [2048, 768, 128]),
            p + "ffn_down_exps.weight": (more, [768, 2048, 128]),
        })
    assert got == want
    # both Q6_K and Q4_K layers are present in the 2-layer sibling (layer 1 is a "more bits" layer)
    assert {got[f"blk.{i}.ffn_down_exps.weight"][0] for i in range(LAYERS)} == {"Q4_K", "Q6_K"}

    # the random blocks decode to finite, zero-mean values of the intended size
    from gguf.quants import dequantize
    for t in r.tensors:
        if t.name in ("blk.1.attn_q.weight", "blk.1.ffn_down_exps.weight", "output.weight"):
            rows = np.array(t.data).reshape(-1, np.array(t.data).shape[-1])[100:400]
            x = dequantize(rows, t.tensor_type)
            assert np.isfinite(x).all()
            fan_in = x.shape[-1]
            assert abs(x.mean()) < 0.05 * x.std(), t.name
            assert 0.05 / math.sqrt(fan_in) < x.std() < 5 / math.sqrt(fan_in), t.name


def run_engine(engine_binary, model, usage, prompt, n):
    env = base_env(model, slots=1, ctx=2048, USAGE_SAVE=1, USAGE_FILE=usage)
    e = Engine(engine_binary, env=env, ready_timeout=120)
    try:
        rid = e.submit(prompt, max_tokens=n, extra=" logprobs=5")
        r = e.result(rid, timeout=180)
        assert r.done is not None, r.errors
        lps = [[float(x) for x in p[6::2]] for k, p, _ in e.events if k == "DATA" and int(p[1]) == rid]
    finally:
        assert e.close(timeout=120) == 0
    counts = np.zeros((LAYERS, 128))
    for ln in usage.read_text().splitlines()[2:]:
        layer, ex, c = map(int, ln.split())
        counts[layer, ex] = c
    return r, lps, counts


def top_quarter_share(counts):
    s = np.sort(counts, axis=1)[:, ::-1]
    return s[:, :32].sum(axis=1) / s.sum(axis=1)


def test_engine_generates_and_skew_moves_expert_use(engine_binary, files, tmp_path):
    # a prompt of random letter runs: hundreds of distinct tokens, so the uniform file's usage is
    # close to uniform (natural text repeats its common tokens, which route alike)
    rnd = random.Random(0)
    prompt = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ") for _ in range(1500))
    n = 8
    shares = {}
    curves = {}
    for name in ("uniform", "skew", "realistic"):
        r, lps, counts = run_engine(engine_binary, files[name], tmp_path / f"{name}.usage", prompt, n)
        st = r.stat()
        assert st["prompt_tokens"] > 600
        assert st["emitted"] + (0 if st["length_limited"] else 1) >= 1
        assert lps and all(len(x) == 5 and all(math.isfinite(v) and v <= 0 for v in x) for x in lps)
        assert any(x[0] != x[-1] for x in lps), "top-5 log-probs all equal: flat logits"
        forwarded = st["prompt_tokens"] + st["emitted"] - 1
        assert np.all(counts.sum(axis=1) == 8 * forwarded) or np.all(counts.sum(axis=1) >= 8 * st["prompt_tokens"])
        shares[name] = top_quarter_share(counts)
        curves[name] = rp.top_shares(counts)
    # uniform: 0.25 plus sampling noise (~0.29 for ~50 picks per expert); measured 0.32-0.33
    assert shares["uniform"].max() < 0.38, shares
    # --skew 0.55: Zipf popularity, a quarter of the experts takes about half of the picks (0.51-0.52)
    assert shares["skew"].min() > 0.44, shares
    assert (shares["skew"] - shares["uniform"]).min() > 0.1, shares
    # --profile realistic: measured 0.447-0.451 / 0.673-0.697 / 0.887-0.896 on this prompt (the
    # uniform file: 0.16-0.18 / 0.31-0.32 / 0.58-0.59, ~54 picks per expert)
    assert (np.abs(curves["realistic"] - rp.TARGET) < 0.06).all(), curves
