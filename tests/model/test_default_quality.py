"""The shipped default model answers like the dense model it came from (issue 11).

At the default expert count (the GGUF's expert_used_count, top-15 of 16): held-out perplexity
within 1.10x of the dense source's on both texts of bench/quality.py (pydoc and KJV), measured
with the engine's forward on both files in the same run; and sensible greedy answers to three
fixed prompts in the model's own chat template, pinned by what they must contain. The answers
were read once and are pinned honestly (not tuned to): the sky is blue by Rayleigh scattering,
the sum function returns sum(numbers), the capital of France is Paris. With fewer experts the
answers degrade (top-14 writes a wrong sum function, top-8 a nonsense sky answer): see the
Pareto table in native/README.md.
"""
from __future__ import annotations

import sys


from tests.model.oracle import engine_greedy
from tests.native.engine import chatml
from tests.support.procs import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import quality  # noqa: E402  (bench/quality.py: held-out texts, fwd_dump perplexity)

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
BAR = 1.10


def test_default_model_perplexity_within_bar_of_dense(default_model, dense_source, engine_binary, fwd_dump):
    ratios = {}
    for name, text in quality.texts().items():
        ids = quality.tokenize(engine_binary, dense_source, text)[:quality.N]
        dense = quality.perplexity(fwd_dump, dense_source, ids)
        moe = quality.perplexity(fwd_dump, default_model, ids)
        ratios[name] = (round(moe / dense, 3), round(dense, 2), round(moe, 2))
    assert all(r[0] <= BAR for r in ratios.values()), f"MoE/dense perplexity (ratio, dense, MoE): {ratios}"


def test_default_model_answers_sensibly(default_model, engine_binary):
    prompts = [chatml(q, system=SYSTEM) for q in (
        "Explain in three sentences why the sky is blue.",
        "Write a Python function that returns the sum of a list of numbers.",
        "What is the capital of France?",
    )]
    sky, func, capital = (g.text.decode("utf-8") for g in engine_greedy(engine_binary, default_model, prompts, 48))
    assert "Rayleigh scattering" in sky, sky
    assert "def " in func and "return sum(numbers)" in func, func
    assert capital.startswith("The capital of France is Paris"), capital
