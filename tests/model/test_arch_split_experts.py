"""Older llama.cpp Mixtral files keep one tensor per expert (blk.N.ffn_{gate,up,down}.E.weight)
instead of the stacked ffn_*_exps; on the llama architecture the engine reads them in place of the
stacked tensors' slices (native/src/model_load.c ld_moe_per_expert, experts.c eoff). The same
weights in either layout (make_arch_fixture.py --arch llama [--split-experts]) give bit-identical
logits, EXACT=1 and the int8 default, and the float64 reference (arch_ref.Llama: Mixtral's
definition) reads the per-expert tensors too: EXACT=1 within test_arch_oracle's tolerance."""
from __future__ import annotations

import numpy as np
import pytest

from tests.model.arch_ref import REFS, greedy, log_softmax
from tests.model.test_arch_oracle import PROMPT, STEPS, TOL_EXACT, compare, engine_logits
from tests.support import procs


@pytest.mark.parametrize("mix", ["q4_k_m", "iq4_xs"])
def test_per_expert_tensors_match_stacked_and_reference(mix, fwd_dump, tmp_path):  # noqa: F811
    stacked = procs.make_arch_fixture(tmp_path / "stacked.gguf", "llama", "--mix", mix)
    split = procs.make_arch_fixture(tmp_path / "split.gguf", "llama", "--mix", mix, "--split-experts")
    ref = REFS["llama"](str(split))
    ids = greedy(ref, PROMPT, STEPS)
    assert ids == greedy(REFS["llama"](str(stacked)), PROMPT, STEPS), "the reference reads the two layouts differently"
    ref_lp = log_softmax(ref.forward(ids))
    vocab = ref_lp.shape[1]
    for env in ({"EXACT": "1", "KV_TYPE": "f32"}, {}):
        a = engine_logits(fwd_dump, stacked, ids, vocab, tmp_path, **env)
        b = engine_logits(fwd_dump, split, ids, vocab, tmp_path, **env)
        assert np.array_equal(a, b), f"{mix} {env}: per-expert tensors give other logits than the stacked ones"
    agree, steps, err = compare(ref_lp, log_softmax(engine_logits(fwd_dump, split, ids, vocab, tmp_path, EXACT="1",
                                                                  KV_TYPE="f32")), len(PROMPT), ids)
    print(f"llama {mix}, one tensor per expert: EXACT=1 greedy {agree}/{steps}, max |d log-prob| {err:.2e}")
    assert agree == steps and err <= TOL_EXACT, (agree, steps, err)
