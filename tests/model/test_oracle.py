"""The engine's forward pass against the numpy reference (native/tools/llama_ref.py).

Engine side: serve mode, temperature 0, `logprobs=32` (greedy ids + the top-32 log-probs of
every step), five prompts submitted at once to five slots (batched decode). Reference side:
teacher-forced over prompt + the engine's 64 tokens (one forward), so every step is checked:
the engine token must be the reference argmax (or within a stated gap of it) and its top-32
log-probs must be within a stated error. All tokens argmax-equal (and, for a stream the engine
ended by EOS, EOS the reference's next argmax) == identical greedy streams.

The oracle proper is the full default model in EXACT=1 (float activations, every weight row
dequantized exactly as the reference's) with TOPK=16 (every expert; the file's unit gating
makes that the dense FFN it encodes) against the float64 reference of the same file with every
expert: identical greedy streams, log-probs equal to the engine's 4 printed decimals. The
default int8-activation path is checked against the same reference with loose bounds: on this
model int8 activations are chaotic (a 1e-7 relative nudge to the activations before int8
quantization moves the int8 reference's log-probs by ~1.0: SmolLM's massive activations make
d = max|x|/127 coarse in their blocks, and a single rounding flip moves a dot product by d·w),
so no reference reproduces it; tests (a) and the C unit tests check the int8 kernels instead.

Measured (2-core AVX2 box, engine at the commit of this test), and the tolerances used:

| model | engine | reference | argmax-equal | logprob err | tolerance |
|---|---|---|---|---|---|
| tiny MoE / shexp+unit, F32 weights | default (KV f16) | exact, K/V rounded to fp16 | 64/64 all | <= 5.3e-5 (the 4-decimal print) | identical; 1e-3 |
| tiny MoE / shexp+unit, Q8_0 | default, KV_TYPE=f32 | with the engine's int8 activations (QuantActModel) | 64/64 all | first <= 3.6e-2, any <= 8e-2 | identical (1 near-tie < 0.05 allowed); 0.25 / 0.5 |
| tiny MoE, Q8_0 | default | exact | diverges at near-ties | first up to 1.3 (a routing flip) | not asserted (why QuantActModel exists) |
| default model (30 layers), TOPK=16 | EXACT=1, KV_TYPE=f32 | exact, same file, 16 experts | 64/64, 7+EOS, 61+EOS, 64/64, 64/64: identical streams (smallest reference top-1/top-2 margin along them 0.0013) | <= 6.4e-5 | identical; 2.5e-4 |
| default model (30 layers), TOPK=16 | EXACT=1, KV_TYPE=f16 | exact, K/V rounded to fp16 | identical streams, as above | first <= 2.1e-3, any <= 8.5e-3 | identical but at near-ties (gap < 0.03); 3e-2 |
| default model (30 layers), TOPK=16 | default (int8), KV_TYPE=f32 | exact, same file, 16 experts | per prompt 0.81 .. 1.0 over four builds of the int8 kernels; worst gap <= 0.72 | first <= 1.72, any <= 1.72 | >= 0.6 per prompt; gap 1.5; 3.0 |
| default model, first 4 layers, MoE with all 16 experts | EXACT=1, KV_TYPE=f32 | exact DENSE 4 layers (the source file) | 64/64 all | first <= 0.06, any <= 0.17 (the builder's requantized down projections) | >= 60/64; gap 0.25; first 0.25, any 0.5 |

Runtime of the full-model EXACT tests on 2 cores: reference load ~7 s once, then per KV type
~12 s (engine ~5 s, one teacher-forced reference forward per prompt ~1 s, the single-slot
rerun ~2 s); the int8 one ~4 s. bench/oracle.py prints the full-model figures, also against
the dense source file.
"""
from __future__ import annotations

import time

import pytest

from tests.model.gguf_slice import slice_gguf
from tests.model.oracle import EOS, Model, QuantActModel, engine_greedy, engine_model_info, forced
from check_tokenizer import Reference  # noqa: E402  (native/tools is on sys.path via tests.model.oracle)
from tests.native.engine import chatml
from tests.support import procs

STEPS = 64
# The full-model tests run the engine with KV_TYPE=f32: they check the forward arithmetic, and
# with fp16 rows a float32-vs-float64 difference of 1e-7 in K can round to a different fp16
# (1e-3), which SmolLM2 amplifies to ~1e-2 in the log-probs. The default fp16 rows are checked
# exactly on the F32-weight fixtures (test_tiny_f32_identical_to_reference, kv_f16=True), and
# on the full model in EXACT=1 with the looser bound that amplification leaves (EXACT_KV).
PROMPTS = [
    "The quick brown fox",
    chatml("What is the capital of France?"),
    "def forward(self, x):\n    return",
    "In the beginning 12345",
    "A mixture of experts routes each token",
]


def _prompt_ids(ref_tok, prompts):
    return [ref_tok.encode(p.encode("utf-8")) for p in prompts]


def _against(model, all_ids, gens, report=None):
    """Per prompt: (prompt, its ids, the engine's run, forced() of that run against model),
    after checking the engine read the same prompt; each forced line also goes to report."""
    for p, ids, g in zip(PROMPTS, all_ids, gens):
        assert g.prompt_tokens == len(ids)
        f = forced(model, ids, g)
        if report is not None:
            report.append(f"{p[:30]!r}: {f}")
        yield p, ids, g, f


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
    model = Model(str(path), kv_f16=True)           # the engine's default KV_TYPE=f16
    for p, ids, g, f in _against(model, _prompt_ids(ref_tok, PROMPTS), gens):
        ref_ids, _ = model.greedy(ids, STEPS, eos=EOS)
        assert g.ids == [t for t in ref_ids if t != EOS], f"{variant} {p!r}: {f}"
        assert f.max_step_err < 1e-3, f"{variant} {p!r}: {f}"


@pytest.mark.parametrize("variant", ["moe", "shexp-unit"])
def test_tiny_q8_matches_int8_activation_reference(variant, tiny_variants, engine_binary):
    path = tiny_variants[variant]
    ref_tok = Reference(str(path))
    # float32 KV here: this test isolates the int8 activations (the fp16 KV rows are checked
    # exactly by the F32-weight test above and the EXACT full-model test below)
    gens = engine_greedy(engine_binary, path, PROMPTS, STEPS, KV_TYPE="f32")
    model = QuantActModel(str(path))
    near_ties = 0
    for p, ids, g, f in _against(model, _prompt_ids(ref_tok, PROMPTS), gens):
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


@pytest.fixture(scope="module")
def moe_all_exact_run(slices, engine_binary):
    return engine_greedy(engine_binary, slices["moe-all"], PROMPTS, STEPS, EXACT="1", KV_TYPE="f32")


def test_moe_all_experts_matches_dense_reference(slices, moe_all_exact_run):
    """Unit gating + every expert = the dense FFN, so the MoE file with top-k 16 must follow the
    numpy DENSE model up to the builder's requantized down projections (F16 expert rows, Q8_0
    shared expert): the engine in EXACT=1 adds nothing measurable on top of those."""
    ref_tok = Reference(str(slices["dense"]))
    model = Model(str(slices["dense"]))
    report = []
    for _, _, g, f in _against(model, _prompt_ids(ref_tok, PROMPTS), moe_all_exact_run, report):
        assert len(g.ids) == STEPS
        assert f.agree >= 60 and f.worst_gap < 0.25, "\n".join(report)
        assert f.first_step_err < 0.25 and f.max_step_err < 0.5, "\n".join(report)
    print("\n".join(report))


def test_topk_env_runs_every_expert(slices, moe_all_run, engine_binary):
    """TOPK=16 on the default file (top-15) == the file that says top-k 16: the same computation."""
    info = engine_model_info(engine_binary, slices["moe"], TOPK="16")
    assert info.get("top_k") == 16, f"engine ignores TOPK: MODEL {info}"
    gens = engine_greedy(engine_binary, slices["moe"], PROMPTS, STEPS, TOPK="16")
    for a, b in zip(gens, moe_all_run):
        assert a.ids == b.ids
        assert a.top[0] == b.top[0]
    plain = engine_greedy(engine_binary, slices["moe"], PROMPTS[:1], STEPS)
    assert plain[0].top[0] != moe_all_run[0].top[0]      # the default top-k really computes less


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


# ---------------------------------------------------------------- (c) the full default model, every expert
# Per KV cache type: the log-prob tolerance, and the largest reference top-1 - top-2 gap a
# differing token may have. float32: measured <= 6.4e-5, the 4 printed decimals (5e-5) + float32
# sums; identical tokens. fp16 (the reference rounds K/V to fp16 too): measured <= 8.5e-3 and
# identical tokens, but a 1e-7 nudge of the reference's activations alone moves its log-probs by
# 3e-3 (values straddling an fp16 rounding boundary flip), so a near-tie may differ.
EXACT_KV = {"f32": (2.5e-4, 0.0), "f16": (3e-2, 0.03)}


@pytest.fixture(scope="module")
def full_ref(default_model):
    """The float64 reference of the default model with every expert (TOPK=16)."""
    return Model(str(default_model), top_k=16)


@pytest.fixture(scope="module")
def full_ids(default_model):
    return _prompt_ids(Reference(str(default_model)), PROMPTS)


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_exact_engine_reproduces_reference(kv, default_model, engine_binary, full_ref, full_ids):
    """EXACT=1, TOPK=16, all 30 layers: identical greedy streams (5 prompts x 64 steps, or up to
    an EOS the reference also picks) and every step's top-32 log-probs within EXACT_KV's bound;
    one slot alone gives the same bits as five batched."""
    tol, gap = EXACT_KV[kv]
    full_ref.kv_f16 = kv == "f16"
    t0 = time.monotonic()
    gens = engine_greedy(engine_binary, default_model, PROMPTS, STEPS, EXACT="1", TOPK="16", KV_TYPE=kv)
    t1 = time.monotonic()
    report = []
    for _, _, g, f in _against(full_ref, full_ids, gens, report):
        msg = "\n".join(report)
        assert f.agree == f.steps or f.worst_gap <= gap, msg
        assert len(g.ids) == STEPS or f.after == EOS, msg       # an EOS end: the reference's too
        assert f.max_step_err < tol, msg
    t2 = time.monotonic()
    # batch independence: the first prompt alone in one slot gives the same bits
    (alone,) = engine_greedy(engine_binary, default_model, PROMPTS[:1], STEPS, EXACT="1", TOPK="16", KV_TYPE=kv)
    assert alone.ids == gens[0].ids and alone.top == gens[0].top
    report.append(f"engine {t1 - t0:.1f} s, reference {t2 - t1:.1f} s, single slot {time.monotonic() - t2:.1f} s")
    print("\n".join(report))


def test_int8_engine_near_reference(default_model, engine_binary, full_ref, full_ids):
    """The default int8-activation path, TOPK=16, all 30 layers, against the same reference:
    loose bounds (see the module docstring: the int8 path is chaotic on this model)."""
    full_ref.kv_f16 = False
    gens = engine_greedy(engine_binary, default_model, PROMPTS, STEPS, TOPK="16", KV_TYPE="f32")
    report = []
    for _, _, g, f in _against(full_ref, full_ids, gens, report):
        msg = "\n".join(report)
        assert f.agree >= 0.6 * f.steps and f.worst_gap < 1.5, msg
        assert f.max_step_err < 3.0, msg
    print("\n".join(report))
