"""The Qwen3.6-35B-A3B-shaped generator (native/tools/make_qwen35moe_big.py): llama.cpp's `qwen35moe`
layout at Q4_K_M with the real widths, written tensor by tensor.

The full file (21.7 GB) is never written here. The plan's arithmetic is held to the figures the
generator's docstring states for the full file (753 tensors: F32 310, Q4_K 379, Q6_K 64;
21,702,472,192 bytes; the MTP-less 733 tensors with 301 F32 of the released files' load logs); a
`--layers 4` file with the realistic profile (3.2 GB, ~30 s: layers 0-2 Gated DeltaNet, 3 full
attention, blk.4 the MTP block) is read back with GGUFReader (keys, tokenizer, template, every
tensor's type, shape and byte range), its random blocks are checked for the intended statistics,
and the engine loads it, generates from the command line, and routes with the profile's popularity
curve.
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
from tests.support.procs import ROOT
from tests.support.reference import chat_template

sys.path.insert(0, str(ROOT / "native" / "tools"))
import make_qwen35moe_big as gen  # noqa: E402
import routing_profile as rp  # noqa: E402
from make_arch_fixture import use_more_bits  # noqa: E402

Q = GGMLQuantizationType
GEN = ROOT / "native" / "tools" / "make_qwen35moe_big.py"
LAYERS = 4


def type_counts(specs):
    out: dict[str, int] = {}
    for s in specs:
        out[s.qtype.name] = out.get(s.qtype.name, 0) + 1
    return out


def nbytes(qt, shape):
    block, size = GGML_QUANT_SIZES[qt]
    return math.prod(shape) // block * size


def test_plan_has_the_full_files_tensors_types_and_size():
    specs = gen.plan()
    assert len(specs) == 753
    assert type_counts(specs) == {"F32": 310, "Q4_K": 379, "Q6_K": 64}
    assert sum(nbytes(s.qtype, s.shape) for s in specs) == 21_702_472_192          # 20.21 GiB
    # without the MTP block (blk.40): the released files' 733 tensors, 301 of them F32
    trunk = [s for s in specs if not s.name.startswith("blk.40.")]
    assert len(trunk) == 733 and type_counts(trunk)["F32"] == 301
    by = {s.name: s for s in specs}
    # 10 full-attention layers (3, 7, .., 39) and the MTP block; the other 30 Gated DeltaNet
    attn = sorted(int(s.name.split(".")[1]) for s in specs if s.name.endswith("attn_q.weight"))
    assert attn == [*range(3, 40, 4), 40]
    assert sum(s.name.endswith("attn_qkv.weight") for s in specs) == 30
    assert {s.name for s in specs if s.name.startswith("blk.40.nextn.")} == {
        f"blk.40.nextn.{t}.weight" for t in ("eh_proj", "enorm", "hnorm", "shared_head_norm")}
    # Q4_K_M: the attn_v-like tensor and both downs of the 21 use_more_bits layers of 41 are Q6_K
    more = [i for i in range(41) if use_more_bits(i, 41)]
    assert more == [0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 35, 36, 37, 38, 39, 40]
    for i in range(41):
        t = "Q6_K" if i in more else "Q4_K"
        v = "attn_v" if i in attn else "attn_qkv"
        for n in (v, "ffn_down_exps", "ffn_down_shexp"):
            assert by[f"blk.{i}.{n}.weight"].qtype.name == t, (i, n)
    assert by["token_embd.weight"].qtype.name == "Q4_K" and by["output.weight"].qtype.name == "Q6_K"
    # the routed experts of one layer: 256 x 512 x 2048 x 3; an expert's bytes per token
    assert by["blk.5.ffn_gate_exps.weight"].shape == (256, 512, 2048)
    assert by["blk.5.ffn_down_exps.weight"].shape == (256, 2048, 512)
    per_expert = {i: sum(nbytes(by[f"blk.{i}.ffn_{n}_exps.weight"].qtype, (512, 2048)) for n in ("gate", "up", "down"))
                  for i in (4, 5)}
    assert per_expert == {4: 2_039_808, 5: 1_769_472}
    # --layers N: the same widths, attention still every 4th, the MTP block after the trunk
    short = gen.plan(8)
    assert sorted(int(s.name.split(".")[1]) for s in short if s.name.endswith("attn_q.weight")) == [3, 7, 8]
    assert {s.name.split(".")[1] for s in short if ".nextn." in s.name} == {"8"}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("q35big") / f"q35-L{LAYERS}-realistic.gguf"
    subprocess.run([sys.executable, str(GEN), str(out), "--layers", str(LAYERS), "--profile", "realistic", "-q"],
                   check=True)
    return out


@pytest.fixture(scope="module")
def reader(small):
    return GGUFReader(str(small))


def kv_value(kv, k):
    f = kv[k]
    if f.types[0].name == "ARRAY":
        return [f.parts[i][0] for i in f.data]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0].name == "STRING" else v[0]


def test_small_file_keys_tokenizer_and_tensors(small, reader):
    r = reader
    kv = {f.name: f for f in r.fields.values()}
    assert kv_value(kv, "general.architecture") == "qwen35moe"
    want = {"block_count": LAYERS + 1, "context_length": 262144, "embedding_length": 2048,
            "attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
            "attention.value_length": 256, "rope.dimension_count": 64, "expert_count": 256, "expert_used_count": 8,
            "expert_feed_forward_length": 512, "expert_shared_feed_forward_length": 512, "ssm.conv_kernel": 4,
            "ssm.state_size": 128, "ssm.group_count": 16, "ssm.time_step_rank": 32, "ssm.inner_size": 4096,
            "full_attention_interval": 4, "nextn_predict_layers": 1}
    for k, v in want.items():
        assert kv_value(kv, f"qwen35moe.{k}") == v, k
    assert kv_value(kv, "qwen35moe.rope.dimension_sections") == [11, 11, 10, 0]
    assert kv_value(kv, "qwen35moe.rope.freq_base") == pytest.approx(1e7)
    assert kv_value(kv, "qwen35moe.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert kv_value(kv, "general.file_type") == 15
    assert (kv_value(kv, "tokenizer.ggml.model"), kv_value(kv, "tokenizer.ggml.pre")) == ("gpt2", "qwen2")
    tokens = [bytes(kv["tokenizer.ggml.tokens"].parts[i]).decode() for i in kv["tokenizer.ggml.tokens"].data]
    types = [int(kv["tokenizer.ggml.token_type"].parts[i][0]) for i in kv["tokenizer.ggml.token_type"].data]
    assert len(tokens) == 248320 and len(set(tokens)) == 248320
    assert tokens[:3] == ["!", '"', "#"]
    # Qwen's special tokens at their ids (control, or user-defined where Qwen marks them not special)
    for i, (t, ty) in {248044: ("<|endoftext|>", 3), 248045: ("<|im_start|>", 3), 248046: ("<|im_end|>", 3),
                       248055: ("<|vision_pad|>", 3), 248056: ("<|image_pad|>", 3), 248058: ("<tool_call>", 4),
                       248063: ("<|fim_pad|>", 3), 248065: ("<|file_sep|>", 3), 248068: ("<think>", 4),
                       248069: ("</think>", 4)}.items():
        assert (tokens[i], types[i]) == (t, ty), i
    assert set(types[:248044]) == {1} and set(types[248070:]) == {5} and tokens[248070] == "[PAD248070]"
    assert (kv_value(kv, "tokenizer.ggml.bos_token_id"), kv_value(kv, "tokenizer.ggml.eos_token_id"),
            kv_value(kv, "tokenizer.ggml.padding_token_id")) == (248044, 248046, 248055)
    assert not kv_value(kv, "tokenizer.ggml.add_bos_token")
    assert len(kv["tokenizer.ggml.merges"].data) == 248044 - 256        # one merge per multi-byte token
    assert kv_value(kv, "tokenizer.chat_template") == chat_template("Qwen3.5-4B.jinja")

    # every tensor: llama.cpp's qwen35moe names and shapes (ggml order), Q4_K_M's types
    more = {i for i in range(LAYERS + 1) if use_more_bits(i, LAYERS + 1)}
    assert more == {2, 4}          # so the small file has both Q4_K and Q6_K downs
    want_t: dict[str, tuple[str, list[int]]] = {
        "token_embd.weight": ("Q4_K", [2048, 248320]), "output.weight": ("Q6_K", [2048, 248320]),
        "output_norm.weight": ("F32", [2048])}
    for i in range(LAYERS + 1):
        p, v = f"blk.{i}.", "Q6_K" if i in more else "Q4_K"
        want_t.update({p + "attn_norm.weight": ("F32", [2048]), p + "post_attention_norm.weight": ("F32", [2048]),
                       p + "ffn_gate_inp.weight": ("F32", [2048, 256]),
                       p + "ffn_gate_exps.weight": ("Q4_K", [2048, 512, 256]),
                       p + "ffn_up_exps.weight": ("Q4_K", [2048, 512, 256]),
                       p + "ffn_down_exps.weight": (v, [512, 2048, 256]),
                       p + "ffn_gate_inp_shexp.weight": ("F32", [2048]),
                       p + "ffn_gate_shexp.weight": ("Q4_K", [2048, 512]), p + "ffn_up_shexp.weight": ("Q4_K", [2048, 512]),
                       p + "ffn_down_shexp.weight": (v, [512, 2048])})
        if i in (3, 4):        # full attention: layer 3 (interval 4) and the MTP block
            want_t.update({p + "attn_q.weight": ("Q4_K", [2048, 8192]), p + "attn_k.weight": ("Q4_K", [2048, 512]),
                           p + "attn_v.weight": (v, [2048, 512]), p + "attn_output.weight": ("Q4_K", [4096, 2048]),
                           p + "attn_q_norm.weight": ("F32", [256]), p + "attn_k_norm.weight": ("F32", [256])})
        else:
            want_t.update({p + "attn_qkv.weight": (v, [2048, 8192]), p + "attn_gate.weight": ("Q4_K", [2048, 4096]),
                           p + "ssm_conv1d.weight": ("F32", [4, 8192]), p + "ssm_dt.bias": ("F32", [32]),
                           p + "ssm_a": ("F32", [32]), p + "ssm_beta.weight": ("Q4_K", [2048, 32]),
                           p + "ssm_alpha.weight": ("Q4_K", [2048, 32]), p + "ssm_norm.weight": ("F32", [128]),
                           p + "ssm_out.weight": ("Q4_K", [4096, 2048])})
    want_t.update({"blk.4.nextn.eh_proj.weight": ("Q4_K", [4096, 2048]), "blk.4.nextn.enorm.weight": ("F32", [2048]),
                   "blk.4.nextn.hnorm.weight": ("F32", [2048]), "blk.4.nextn.shared_head_norm.weight": ("F32", [2048])})
    got = {t.name: (t.tensor_type.name, [int(x) for x in t.shape]) for t in r.tensors}
    assert got == want_t
    size = {"F32": (1, 4), "Q4_K": (256, 144), "Q6_K": (256, 210)}
    end = 0
    for t in sorted(r.tensors, key=lambda t: t.data_offset):
        blk, bs = size[t.tensor_type.name]
        assert t.n_bytes == math.prod(int(x) for x in t.shape) // blk * bs, t.name
        assert t.data_offset >= end
        end = t.data_offset + t.n_bytes
    assert end <= small.stat().st_size < end + 64
    # ssm_a = -exp(A_log) in [-16, -1]; the routers' rows of the realistic profile's spread of scales
    a = next(t for t in r.tensors if t.name == "blk.0.ssm_a").data
    assert (a <= -1).all() and (a >= -16).all()
    router = np.array(next(t for t in r.tensors if t.name == "blk.1.ffn_gate_inp.weight").data)
    row_sd = router.std(axis=1) * math.sqrt(2048) / gen.ROUTER_SCALE
    assert np.allclose(np.sort(row_sd)[::-1], rp.rank_scales(256, 8), rtol=0.05), row_sd[:8]


def test_random_blocks_have_the_intended_statistics(reader):
    for name, std in (("blk.1.ffn_gate_exps.weight", 1 / math.sqrt(2048)),
                      ("blk.2.ffn_down_exps.weight", gen.DOWN_SCALE / math.sqrt(512)),       # Q6_K
                      ("blk.1.ffn_down_exps.weight", gen.DOWN_SCALE / math.sqrt(512)),       # Q4_K
                      ("blk.2.attn_qkv.weight", 1 / math.sqrt(2048)),
                      ("blk.0.ssm_out.weight", gen.OUT_SCALE / math.sqrt(4096)),
                      ("token_embd.weight", gen.EMB_STD),
                      ("output.weight", gen.HEAD_SCALE / math.sqrt(2048))):
        t = next(t for t in reader.tensors if t.name == name)
        raw = np.array(t.data)
        x = dequantize(raw.reshape(-1, raw.shape[-1])[1000:1064], t.tensor_type).astype(np.float64)
        assert np.isfinite(x).all()
        sd = x.std()
        assert abs(sd / std - 1) < 0.1, (name, sd, std)
        assert abs(x.mean()) < 0.02 * sd, name


def test_engine_generates_from_the_command_line(engine_binary, small):
    r = subprocess.run([str(engine_binary), "-m", str(small), "-p", "hi", "-n", "4", "--threads", "2"],
                       capture_output=True, timeout=600)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert f"(qwen35moe, {LAYERS} layers, 256 experts, top-8)" in err, err
    assert "decode: 4 tokens" in err, err
    assert r.stdout, err


def test_engine_routes_the_small_file_with_the_realistic_curve(engine_binary, small):
    # the random-letter prompt: ~1,700 tokens, ~53 picks per expert and layer
    prompt_tokens, counts = route_counts(engine_binary, small, 300, 600)
    assert counts.shape == (LAYERS, 256)          # the MTP block is not run
    assert prompt_tokens > 1000
    shares = rp.top_shares(counts)
    # measured 0.44-0.46 / 0.67-0.69 / 0.89-0.90 on this file (the uniform profile: 0.19 / 0.34 / 0.61)
    assert (np.abs(shares - rp.TARGET) < (0.06, 0.05, 0.04)).all(), shares
