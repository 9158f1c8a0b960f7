"""qwen35moe (Qwen3.5 / Qwen3.6 MoE, a Gated DeltaNet / gated attention hybrid): the tiny F32 file
of native/tools/make_tiny_qwen35moe.py through the engine against tests/model/qwen35_ref.py's
float64 forward, in EXACT mode (float activations, F32 K/V):
  - one prefill of a prompt + the reference's greedy continuation: same greedy choices, max
    |d log-prob| over the top 32 <= 2e-3 (measured: ~1e-5);
  - the same ids in two chunks (the recurrent state carried between forwards) and one token at a
    time: bit-identical logits to one pass;
  - serve mode, one slot, two turns: the second turn extending the first resumes the slot's
    state (reused > 0) and answers as a fresh prefill on another slot; a turn that does not extend
    the slot's history re-prefills (reused = 0: no K/V prefix without its recurrent state) and
    answers as a fresh prefill; the same prompt again resumes from the checkpoint before its last
    token;
  - checkpoints (rstate.c): a turn that edits the last user message (a shorter shared prefix than
    the slot's history) resumes from the first turn's end, a long prompt's prefill checkpoints
    every STATE_CKPT_EVERY positions, and KVSAVE=1 keeps state and checkpoints across a restart:
    each answers as a cold prefill, EXACT=1;
  - a 40-token prompt with the budget's prefill chunk at 32 rows (CTX 60) answers as in one part;
  - also a file with full_attention_interval 2 and a Q8_0 one; a file without the layer pattern
    is refused naming the key;
  - the file's MTP block is not run: the reference has no MTP either.
llama.cpp agreement (a one-off, bench/arch_crosscheck.py --arch qwen35moe; make test cannot depend on a
llama.cpp build): see native/README.md.
"""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from tests.model.arch_ref import agreement, log_softmax
from tests.model.qwen35_ref import Qwen35Moe
from tests.native.engine import Engine, base_env, chatml, parse_model_line
from tests.support import procs

PROMPT = [5, 17, 42, 99, 7, 250, 33, 8, 120, 64]
STEPS = 8
TOL_EXACT = 2e-3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The default tiny file, one with full_attention_interval 2 (layers 1 and 3 attention) and a
    Q8_0 one (matrices Q8_0; the reference reads them through gguf's dequantizer)."""
    d = tmp_path_factory.mktemp("q35")
    return {"f32": procs.make_tiny_qwen35moe(d / "f32.gguf"),
            "interval2": procs.make_tiny_qwen35moe(d / "i2.gguf", "--interval", "2", "--no-mtp"),
            "q8_0": procs.make_tiny_qwen35moe(d / "q8.gguf", "--q8")}


@pytest.fixture(scope="module")
def model(files):
    return files["f32"]


def greedy_reference(path):
    ref = Qwen35Moe(str(path))
    ids = list(PROMPT)
    state: dict = {}
    lg = ref.forward(ids, state)            # incremental greedy: the reference's own state carried
    for _ in range(STEPS):
        t = int(np.argmax(lg[-1]))
        lg = ref.forward([t], state, len(ids))
        ids.append(t)
    return ids, log_softmax(ref.forward(ids))


@pytest.fixture(scope="module")
def reference(model):
    return greedy_reference(model)


def dump(fwd_dump, model, ids, tmp_path, **env):
    out = tmp_path / "logits.f32"
    subprocess.run([str(fwd_dump), str(model), str(out), *map(str, ids)], check=True,
                   env=dict(os.environ, EXACT="1", KV_TYPE="f32", **env))
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


@pytest.mark.parametrize("variant", ["f32", "interval2", "q8_0"])
def test_exact_against_reference(fwd_dump, files, variant, tmp_path):
    ids, ref = greedy_reference(files[variant])
    eng = log_softmax(dump(fwd_dump, files[variant], ids, tmp_path).astype(np.float64))
    agree, err = agreement(eng, ref, ids, len(PROMPT) - 1)
    print(f"qwen35moe {variant} EXACT=1: greedy {agree}/{STEPS}, max |d log-prob| {err:.2e}")
    assert agree == STEPS, f"{variant}: greedy choice differs from the reference at {STEPS - agree} steps"
    assert err <= TOL_EXACT, f"{variant}: log-prob error {err:.3g} > {TOL_EXACT}"


def test_refuses_without_layer_pattern(fwd_dump, tmp_path):
    """No full_attention_interval (nor attention.recurrent_layers): refused naming the key, not a
    guessed interval."""
    path = procs.make_tiny_qwen35moe(tmp_path / "nokey.gguf", "--interval", "0")
    r = subprocess.run([str(fwd_dump), str(path), str(tmp_path / "x.f32"), "5"], capture_output=True, text=True)
    assert r.returncode != 0 and "qwen35moe.full_attention_interval" in r.stderr, r.stderr


@pytest.mark.parametrize("how", [{"FWD_DUMP_SPLIT": "4"}, {"FWD_DUMP_SPLIT": "11"}, {"FWD_DUMP_SERIAL": "1"}],
                         ids=["split4", "split11", "serial"])
def test_chunks_equal_one_pass(fwd_dump, model, reference, tmp_path, how):
    ids, _ = reference
    one = dump(fwd_dump, model, ids, tmp_path)
    parts = dump(fwd_dump, model, ids, tmp_path, **how)
    assert np.array_equal(one, parts), f"{how}: logits differ from one pass (max {np.abs(one - parts).max():.3g})"


def test_turns_on_one_slot(engine_binary, model):
    e = Engine(engine_binary, env=base_env(model, slots=3, ctx=512))
    try:
        p1 = chatml("Hello there, how are you?").encode()
        r1 = e.generate(p1, slot=0, max_tokens=6)
        p2 = p1 + r1.text + b"<|im_end|>\n" + chatml("And then?").encode()
        r2 = e.generate(p2, slot=0, max_tokens=6)
        assert r2.reused is not None and r2.reused >= r1.prompt_tokens, (
            f"the extending turn did not resume the slot's state: reused={r2.reused}, first prompt {r1.prompt_tokens}")
        # not an extension of slot 0's history: a K/V prefix is shared, the recurrent state is not
        p3 = p1 + b"Something else entirely.<|im_end|>\n" + chatml("Now?").encode()
        r3 = e.generate(p3, slot=0, max_tokens=6)
        # only where a state was kept: the checkpoint turn 1's prefill made before its last token
        assert r3.reused == r1.prompt_tokens - 1, (
            f"a non-extending turn kept {r3.reused} positions, not turn 1's checkpoint at {r1.prompt_tokens - 1}")
        # fresh prefills of both prompts on two other slots at once (rows of two slots per forward)
        a, b = e.submit(p2, slot=1, max_tokens=6), e.submit(p3, slot=2, max_tokens=6)
        fresh, fresh3 = e.result(a), e.result(b)
        assert fresh.done is not None and fresh3.done is not None, (fresh.errors, fresh3.errors)
        assert fresh.reused == 0 and fresh.text == r2.text, "resumed turn differs from a fresh prefill"
        assert r3.text == fresh3.text, "re-prefilled turn differs from a fresh prefill"
        # the identical prompt again: its last token is re-forwarded, from the checkpoint its
        # prefill kept before that token
        r4 = e.generate(p3, slot=0, max_tokens=6)
        assert r4.reused == r3.prompt_tokens - 1 and r4.text == r3.text, (r4.reused, r3.prompt_tokens)
    finally:
        try:
            e.close(10)
        finally:
            e.kill()


def test_prefill_parts(engine_binary, model):
    """CTX 60: the budget's prefill chunk is 32 rows, so a longer prompt's forward runs its blocks
    (the DeltaNet layers' too) a part at a time: the same text as with CTX 512 (one part)."""
    prompt = chatml("Tell me a long story about a cat and a dog, please.").encode()
    texts = []
    for ctx in (60, 512):
        e = Engine(engine_binary, env=base_env(model, slots=1, ctx=ctx))
        try:
            r = e.generate(prompt, slot=0, max_tokens=6)
            texts.append((r.prompt_tokens, r.text, e.stderr_text()))
        finally:
            try:
                e.close(10)
            finally:
                e.kill()
    assert 32 < texts[0][0] <= 52, f"prompt of {texts[0][0]} tokens does not span two 32-row parts"
    assert texts[0][1] == texts[1][1], "prefill in parts differs from one part"


def _stop(e):
    try:
        e.close(10)
    finally:
        e.kill()


def _slotmem(r, slot):
    """The turn's SLOTMEM line: (kv_bytes, state_bytes, checkpoints)."""
    f = r.block_line("SLOTMEM").split()
    assert f[1] == str(slot), f
    return int(f[2]), int(f[3]), int(f[4])


@pytest.mark.parametrize("variant,interval", [("f32", 3), ("interval2", 2)])
def test_kv_only_for_attention_layers(engine_binary, files, variant, interval):
    """Only the full-attention layers keep K/V: the tool's 4 layers attend where (l + 1) % interval
    is 0; a position takes their K and V rows (2 KV heads x (32 + 32) float32 values) and its token
    id, in the MODEL line, the budget's KV share (3 slots x CTX 512) and a turn's SLOTMEM."""
    n_att = sum((layer + 1) % interval == 0 for layer in range(4))
    pos_bytes = n_att * 2 * (32 + 32) * 4 + 4
    e = Engine(engine_binary, env=_exact_env(files[variant]))
    try:
        r = e.generate(chatml("Hello there, how are you?").encode(), slot=0, max_tokens=4)
        info = parse_model_line(e.latest["MODEL"])
        assert info["kv"] == {"layers": n_att, "pos_bytes": pos_bytes}, info["kv"]
        assert info["memory"]["kv_mb"] == pytest.approx(3 * 512 * pos_bytes / 2**20, abs=0.05), info["memory"]
        kv_b, _, _ = _slotmem(r, 0)
        assert kv_b % pos_bytes == 0 and kv_b // pos_bytes >= r.prompt_tokens, (kv_b, pos_bytes, r.prompt_tokens)
    finally:
        _stop(e)


def _exact_env(model, **extra):
    return base_env(model, slots=3, ctx=512, EXACT=1, KV_TYPE="f32", **extra)


def _gen(e, prompt, slot, max_tokens):
    """A greedy turn with logprobs=5: (request, each DATA's log-probability and top-5 fields).
    EXACT=1: a resumed turn's figures equal a cold run's to the printed digit."""
    r = e.result(e.submit(prompt, slot=slot, max_tokens=max_tokens, extra=" logprobs=5"))
    assert r.done is not None, r.errors
    lps = [parts[3:] for kind, parts, _ in e.events[r.first_event:r.last_event + 1]
           if kind == "DATA" and parts[1] == str(r.id)]
    return r, lps


def test_edited_turn_resumes_from_a_checkpoint(engine_binary, model):
    """Turn 3 re-sends turn 2's conversation with its last user message edited: the slot's
    history (turn 2's) shares less than turn 2's prompt, its live state is past that, and the
    turn resumes from turn 1's end instead of re-prefilling. Same text as a cold run."""
    e = Engine(engine_binary, env=_exact_env(model))
    try:
        p1 = chatml("Hello there, how are you?").encode()
        r1 = e.generate(p1, slot=0, max_tokens=6)
        head = p1 + r1.text + b"<|im_end|>\n"
        r2 = e.generate(head + chatml("And then?").encode(), slot=0, max_tokens=6)
        assert r2.reused >= r1.prompt_tokens
        kv_b, st_b, n_ck = _slotmem(r2, 0)
        assert kv_b > 0 and n_ck >= 2 and st_b > 0, (kv_b, st_b, n_ck)
        p3 = head + chatml("What about the weather tomorrow?").encode()
        r3, lp3 = _gen(e, p3, 0, 8)
        turn1_end = r1.prompt_tokens + len(r1.data) - 1     # the last sampled token is not forwarded
        assert r3.reused == turn1_end, f"edited turn reused {r3.reused}, turn 1 ended at {turn1_end}"
        cold, lpc = _gen(e, p3, 1, 8)
        assert cold.reused == 0 and cold.text == r3.text and lpc == lp3, (cold.text, r3.text)
        assert cold.prompt_tokens == r3.prompt_tokens
    finally:
        _stop(e)


def test_long_prefill_checkpoints_every_n(engine_binary, model):
    """STATE_CKPT_EVERY=16: a long prompt's prefill keeps its state at 16, 32, ... (the last
    MODEL_STATE_CKPTS of them and of the prompt's and turn's ends); a second prompt sharing 90 % of
    it then diverging resumes from a multiple of 16."""
    e = Engine(engine_binary, env=_exact_env(model, STATE_CKPT_EVERY=16))
    try:
        story = "Tell me a long story about a cat, a dog and a very patient mouse, please. " * 2
        r1 = e.generate(chatml(story).encode(), slot=0, max_tokens=2)
        assert r1.prompt_tokens > 40, r1.prompt_tokens
        full = chatml(story).encode()
        p2 = full[:len(full) * 9 // 10] + b" Actually, never mind."
        r2, lp2 = _gen(e, p2, 0, 6)
        assert r2.reused > 0 and r2.reused % 16 == 0, f"reused {r2.reused}: not a checkpoint at a multiple of 16"
        cold, lpc = _gen(e, p2, 1, 6)
        assert cold.reused == 0 and cold.text == r2.text and lpc == lp2
    finally:
        _stop(e)


def test_kvsave_keeps_state_across_a_restart(engine_binary, model, tmp_path):
    """KVSAVE=1: each slot's file and its state file beside it. After a restart, slot 1's next
    turn extends its history from the saved live state, and slot 0's edited turn resumes from
    turn 1's end (a saved checkpoint); each answers as a cold run."""
    env = _exact_env(model, KVSAVE=1, KV_DIR=tmp_path)
    p1 = chatml("Hello there, how are you?").encode()
    e = Engine(engine_binary, env=env)
    try:
        r1 = e.generate(p1, slot=0, max_tokens=6)
        head = p1 + r1.text + b"<|im_end|>\n"
        e.generate(head + chatml("And then?").encode(), slot=0, max_tokens=6)
        e.generate(p1, slot=1, max_tokens=6)
    finally:
        _stop(e)
    assert sorted(p.name.rsplit(".", 2)[-2:][0] for p in tmp_path.glob("*.rs")) == ["0", "1"], list(tmp_path.iterdir())
    p_edit = head + chatml("What about the weather tomorrow?").encode()
    p_ext = head + chatml("And then?").encode()
    e = Engine(engine_binary, env=env)
    try:
        r_ext, lp_ext = _gen(e, p_ext, 1, 8)
        r_edit, lp_edit = _gen(e, p_edit, 0, 8)
        assert r_ext.reused == r1.prompt_tokens + len(r1.data) - 1, f"extension after restart reused {r_ext.reused}"
        assert r_edit.reused == r1.prompt_tokens + len(r1.data) - 1, f"edit after restart reused {r_edit.reused}"
        (cold_ext, lpc_ext), (cold_edit, lpc_edit) = _gen(e, p_ext, 2, 8), _gen(e, p_edit, 2, 8)
        assert cold_ext.reused == 0 and cold_ext.text == r_ext.text and lpc_ext == lp_ext
        assert cold_edit.reused == 0 and cold_edit.text == r_edit.text and lpc_edit == lp_edit
    finally:
        _stop(e)
