"""The engine's forward pass against the numpy reference (native/tools/llama_ref.py).

Engine side: serve mode, temperature 0, `logprobs=32` (greedy ids + the top-32 log-probs of
every step), five prompts submitted at once to five slots (batched decode). Reference side:
teacher-forced over prompt + the engine's 64 tokens (one forward), so every step is checked:
the engine token must be the reference argmax (or within a stated gap of it) and its top-32
log-probs must be within a stated error. All tokens argmax-equal == identical greedy streams.

Measured (2-core AVX2 box, engine at the commit of this test), and the tolerances used:

| model | reference | argmax-equal | logprob err | tolerance |
|---|---|---|---|---|
| tiny MoE / shexp+unit, F32 weights | exact | 64/64 all | <= 5.3e-5 (the 4-decimal print) | identical; 1e-3 |
| tiny MoE / shexp+unit, Q8_0 | with the engine's int8 activations (QuantActModel) | 64/64 all | first <= 3.6e-2, any <= 8e-2 | identical (1 near-tie < 0.05 allowed); 0.25 / 0.5 |
| tiny MoE, Q8_0 | exact | diverges at near-ties | first up to 1.3 (a routing flip) | not asserted (why QuantActModel exists) |
| default model, first 4 layers, MoE with all 16 experts | exact DENSE 4 layers | >= 59/64 | first <= 0.39, any <= 0.99; worst gap 0.39 | >= 54/64; gap 1.0; first 1.0, any 2.0 |

The Q4_1 slices differ from numpy far more than the Q8_0 fixtures; per-tensor experiments show
no single matrix is off (each alone adds <= 0.03 to the logits) but SmolLM's early layers
amplify small differences (massive activations), so the slice bounds are loose on purpose.
"""
from __future__ import annotations

import pytest

from tests.model.gguf_slice import slice_gguf
from tests.model.oracle import EOS, Model, QuantActModel, engine_greedy, engine_model_info, forced
from check_tokenizer import Reference  # noqa: E402  (native/tools is on sys.path via tests.model.oracle)
from tests.native.engine import chatml
from tests.support import procs

STEPS = 64
PROMPTS = [
    "The quick brown fox",
    chatml("What is the capital of France?"),
    "def forward(self, x):\n    return",
    "In the beginning 12345",
    "A mixture of experts routes each token",
]


def _prompt_ids(ref_tok, prompts):
    return [ref_tok.encode(p.encode("utf-8")) for p in prompts]


# ---------------------------------------------------------------- (a) tiny fixtures
@pytest.fixture(scope="module")
def tiny_variants(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("oracle-tiny")
    return {
        "moe": tiny_model,
        "shexp-unit": procs.make_tiny_model(d / "shexp.gguf", "--shared-expert", "--gating", "unit"),
        "moe-f32": procs.make_tiny_model(d / "moe-f32.gguf", "--f32"),
        "shexp-unit-f32": procs.make_tiny_model(d / "shexp-f32.gguf", "--shared-expert", "--gating", "unit", "--f32"),
    }


@pytest.mark.parametrize("variant", ["moe-f32", "shexp-unit-f32"])
def test_tiny_f32_identical_to_reference(variant, tiny_variants, engine_binary):
    path = tiny_variants[variant]
    ref_tok = Reference(str(path))
    gens = engine_greedy(engine_binary, path, PROMPTS, STEPS)
    model = Model(str(path))
    for p, ids, g in zip(PROMPTS, _prompt_ids(ref_tok, PROMPTS), gens):
        assert g.prompt_tokens == len(ids)
        f = forced(model, ids, g)
        ref_ids, _ = model.greedy(ids, STEPS, eos=EOS)
        assert g.ids == [t for t in ref_ids if t != EOS], f"{variant} {p!r}: {f}"
        assert f.max_step_err < 1e-3, f"{variant} {p!r}: {f}"


@pytest.mark.parametrize("variant", ["moe", "shexp-unit"])
def test_tiny_q8_matches_int8_activation_reference(variant, tiny_variants, engine_binary):
    path = tiny_variants[variant]
    ref_tok = Reference(str(path))
    gens = engine_greedy(engine_binary, path, PROMPTS, STEPS)
    model = QuantActModel(str(path))
    near_ties = 0
    for p, ids, g in zip(PROMPTS, _prompt_ids(ref_tok, PROMPTS), gens):
        assert g.prompt_tokens == len(ids)
        f = forced(model, ids, g)
        assert f.first_step_err < 0.25 and f.max_step_err < 0.5, f"{variant} {p!r}: {f}"
        if f.agree < f.steps:
            assert f.worst_gap < 0.05, f"{variant} {p!r}: not a near-tie: {f}"
            near_ties += 1
        if len(g.ids) < STEPS:       # ended by EOS: the reference must end there too
            assert model.greedy(ids + g.ids, 1, eos=EOS)[0] == [EOS]
    assert near_ties <= 1


# ---------------------------------------------------------------- (b) default model slices
LAYERS = 4


@pytest.fixture(scope="module")
def slices(default_model, dense_source, tmp_path_factory):
    d = tmp_path_factory.mktemp("slices")
    return {
        "dense": slice_gguf(dense_source, d / f"dense-{LAYERS}l.gguf", LAYERS),
        "moe-all": slice_gguf(default_model, d / f"moe-{LAYERS}l-top16.gguf", LAYERS, top_k=16),
        "moe": slice_gguf(default_model, d / f"moe-{LAYERS}l.gguf", LAYERS),
    }


@pytest.fixture(scope="module")
def moe_all_run(slices, engine_binary):
    return engine_greedy(engine_binary, slices["moe-all"], PROMPTS, STEPS)


def test_moe_all_experts_matches_dense_reference(slices, moe_all_run):
    """Unit gating + every expert = the dense FFN, so the MoE file with top-k 16 must follow the
    numpy DENSE model (up to the engine's quantized activations and the F16/Q8_0 requantized
    down projections)."""
    ref_tok = Reference(str(slices["dense"]))
    model = Model(str(slices["dense"]))
    report = []
    for p, ids, g in zip(PROMPTS, _prompt_ids(ref_tok, PROMPTS), moe_all_run):
        assert g.prompt_tokens == len(ids)
        assert len(g.ids) == STEPS
        f = forced(model, ids, g)
        report.append(f"{p[:30]!r}: {f}")
        assert f.agree >= 54 and f.worst_gap < 1.0, "\n".join(report)
        assert f.first_step_err < 1.0 and f.max_step_err < 2.0, "\n".join(report)
    print("\n".join(report))


def test_topk_env_runs_every_expert(slices, moe_all_run, engine_binary):
    """TOPK=16 on the top-8 file == the file that says top-k 16: the same computation."""
    info = engine_model_info(engine_binary, slices["moe"], TOPK="16")
    assert info.get("top_k") == 16, f"engine ignores TOPK: MODEL {info}"
    gens = engine_greedy(engine_binary, slices["moe"], PROMPTS, STEPS, TOPK="16")
    for a, b in zip(gens, moe_all_run):
        assert a.ids == b.ids
        assert a.top[0] == b.top[0]
    plain = engine_greedy(engine_binary, slices["moe"], PROMPTS[:1], STEPS)
    assert plain[0].top[0] != moe_all_run[0].top[0]      # top-8 really computes less


# ---------------------------------------------------------------- full default model
def test_default_model_answers_paris(default_model, engine_binary):
    prompt = chatml("What is the capital of France?",
                    system="You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    ref_tok = Reference(str(default_model))
    ids = ref_tok.encode(prompt.encode())
    assert len(ids) == 37                                  # default-model.md §2.4
    (g,) = engine_greedy(engine_binary, default_model, [prompt], 16)
    text = g.text.decode("utf-8")
    assert "Paris" in text, text
    assert text.startswith("The capital of France is Paris"), text
