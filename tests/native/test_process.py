"""Engine process lifecycle: handshake, shutdown paths, startup refusals, expert tiers and
heat persistence, tokenizer CLI. Each test starts its own engine process(es)."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import time

import pytest

from tests.native.engine import (READY, SCALE, T, base_env, chatml, parse_hwinfo, parse_map,
                                 parse_model_line, parse_tiers)

pytestmark = pytest.mark.timeout(int(120 * SCALE))


def tier_counts(emap: bytes):
    c = [0, 0, 0, 0]
    for b in emap:
        c[b >> 6] += 1
    return c


def bitlen_heat(n: int) -> int:
    return min(63, n.bit_length())


def test_it_handshake(spawn):
    e = spawn(slots=2)
    e.sync()
    assert not e.errors0
    lines = [" ".join(p) for k, p, _ in e.events if k != "ERROR"]
    kinds = [ln.split(" ", 1)[0] for ln in lines]
    assert kinds and kinds[0] == "STAT", f"first line after READY should be STAT: {lines[:6]}"
    stat = lines[0].split(" ")[1:]
    assert len(stat) in (4, 6), f"startup STAT has {len(stat)} values: {lines[0]!r}"
    for v in stat:
        float(v)
    for k in ("HWINFO", "TIERS", "EMAP", "MODEL"):
        assert k in kinds, f"handshake lacks {k}: {kinds}"
    assert "HITS" not in kinds, "no HITS expected at startup"
    assert kinds.index("STAT") < kinds.index("EMAP")
    cores, tot, avail, ngpu, vram, names = parse_hwinfo(e.latest["HWINFO"])
    assert cores >= 1 and tot > 0 and 0 <= avail <= tot + 0.1 and ngpu == 0
    vr, ram, disk, _, _ = parse_tiers(e.latest["TIERS"])
    rows, cols, emap = parse_map(e.latest["EMAP"], "EMAP")
    assert (rows, cols, len(emap)) == (4, 8, 32)
    assert vr + ram + disk == rows * cols
    c = tier_counts(emap)
    assert (c[2], c[1], c[0], c[3]) == (vr, ram, disk, 0)
    assert all(b & 63 == 0 for b in emap), "fresh usage file: all heat must be 0"
    model = parse_model_line(e.latest["MODEL"])
    assert isinstance(model, dict) and model, f"MODEL json: {model!r}"
    assert e.close() == 0


def test_it_dense_and_shared_expert_models_load(spawn):
    """Dense fixture: no MoE rows; shared-expert + unit-gating fixture: serves normally."""
    for name in ("shexp", "dense"):
        e = spawn(model=name, slots=1)
        e.sync()
        r = e.generate(chatml("hello"), max_tokens=6)
        assert r.done is not None
        rows, cols, emap = parse_map(r.block_line("EMAP") or e.latest["EMAP"], "EMAP")
        if name == "dense":
            assert rows * cols == 0 and emap == b"", f"dense model EMAP should be empty: {e.latest['EMAP']!r}"
        else:
            assert (rows, cols) == (4, 8)
        assert e.close() == 0


def test_it_bad_frame_exits_zero(spawn):
    e = spawn(slots=2)
    a = e.submit(chatml("count to twenty"), slot=0, max_tokens=20)
    e.write(b"SUBMIT 77 1 5 4 0 1\nhelloX\n")
    ra = e.result(a)
    e.wait(lambda: 77 in e.reqs and e.reqs[77].errors, what="ERROR 77 BAD_FRAME")
    assert e.reqs[77].codes == ["BAD_FRAME"], e.reqs[77].errors
    assert ra.done is not None, "in-flight request must finish after BAD_FRAME"
    rc = e.wait_exit(T)   # stdin is still open: the engine must exit by itself
    assert rc == 0, f"exit code after BAD_FRAME: {rc}"


def test_it_eof_drains(spawn):
    e = spawn(slots=2)
    a = e.submit(chatml("first"), slot=0, max_tokens=20)
    b = e.submit(chatml("second"), slot=1, max_tokens=20)
    e.close_stdin()
    rc = e.wait_exit(T)
    assert rc == 0, f"exit code after EOF: {rc}"
    for rid in (a, b):
        r = e.reqs[rid]
        assert r.done is not None, f"request {rid} got no DONE before exit: {r.errors}"
        assert r.stat()["emitted"] == len(r.data)


LONG_CTX = 16384  # the fixture decodes ~10k tok/s: a long request must outlast the test's steps


def _start_long(e, slot=0):
    """A greedy request with a budget of LONG_CTX tokens, still decoding after 2 DATA frames."""
    for p in ("Write a very long essay about the sea.", "Keep talking forever.", "List many words."):
        rid = e.submit(chatml(p), slot=slot, max_tokens=LONG_CTX - 64, temperature=0)
        r = e.reqs[rid]
        e.wait(lambda: len(r.data) >= 2 or r.finished, what="first DATA")
        if not r.finished:
            return r
    pytest.fail("every long greedy request ended by itself within 2 tokens")


def test_it_sigterm_exits_promptly(spawn):
    e = spawn(model="endless", slots=2, ctx=LONG_CTX)
    r = _start_long(e)
    t0 = time.monotonic()
    e.signal(signal.SIGTERM)
    rc = e.wait_exit(5 * SCALE)
    dt = time.monotonic() - t0
    assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM), f"exit code after SIGTERM: {rc}"
    assert r.done is not None, f"active request got no DONE on SIGTERM (rc {rc}, {dt:.2f}s)"
    assert r.stat()["length_limited"] == 0


def test_it_exits_when_nobody_reads_its_replies(engine_bin, models, tmp_path):
    """A killed bridge leaves its engine with a broken stdout: the engine stops decoding and
    exits rather than finish a long turn nobody can read (an orphan once decoded for 13 minutes
    on two cores, slowing everything else on the machine)."""
    env = base_env(models["endless"], slots=1, ctx=131072, COLI_USAGE=str(tmp_path / "usage"))
    p = subprocess.Popen([str(engine_bin)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)
    try:
        while p.stdout.readline() != READY:
            pass
        body = chatml("Write a very long essay about the sea.").encode()
        p.stdin.write(f"SUBMIT 1 0 {len(body)} 130000 0 1\n".encode() + body + b"\n")
        p.stdin.flush()
        while not p.stdout.readline().startswith(b"DATA "):
            pass
        p.stdout.close()
        p.stdin.close()
        assert p.wait(10 * SCALE) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_it_sigint_soft_stop(spawn):
    e = spawn(model="endless", slots=2, ctx=LONG_CTX)
    r = _start_long(e)
    e.signal(signal.SIGINT)
    e.wait(lambda: r.done is not None or r.finished, what="DONE after SIGINT")
    assert r.done is not None and r.stat()["length_limited"] == 0
    assert e.proc.poll() is None, "SIGINT must not end the engine"
    r2 = e.generate(chatml("still there?"), slot=1, max_tokens=4)
    assert r2.done is not None
    assert e.close() == 0


@pytest.mark.parametrize("slots", ["0", "99"])
def test_it_kv_slots_refused(spawn, slots):
    e = spawn(slots=slots, wait_ready=False)
    rc = e.wait_exit(T)
    assert not e.ready, f"KV_SLOTS={slots}: engine reached READY"
    assert rc > 0, f"KV_SLOTS={slots}: expected a non-zero exit, got {rc}"
    assert e.stderr_text().strip(), f"KV_SLOTS={slots}: no message on stderr"


def _corrupt(src, dst, how):
    data = bytearray(open(src, "rb").read())
    if how == "truncated-header":
        data = data[:1000]
    elif how == "truncated-data":
        data = data[:-4096]
    elif how == "bad-magic":
        data[0:4] = b"FUGG"
    elif how == "wrong-arch":
        key = b"general.architecture"
        i = data.index(key) + len(key)
        vtype, n = struct.unpack_from("<IQ", data, i)
        assert vtype == 8 and data[i + 12:i + 12 + n] == b"llama"
        data[i + 12:i + 17] = b"bloom"
    elif how == "empty":
        data = b""
    open(dst, "wb").write(bytes(data))
    return dst


@pytest.mark.parametrize("how", ["truncated-header", "truncated-data", "bad-magic", "wrong-arch", "empty", "missing"])
def test_it_bad_gguf_refused(spawn, models, tmp_path, how):
    path = tmp_path / f"{how}.gguf"
    if how != "missing":
        _corrupt(models["moe"], path, how)
    e = spawn(model=path, wait_ready=False)
    rc = e.wait_exit(T)
    err = e.stderr_text().strip()
    assert not e.ready, f"{how}: engine reached READY on a bad model"
    assert rc > 0, f"{how}: expected a non-zero exit code (no signal), got {rc}; stderr: {err[-500:]}"
    assert err, f"{how}: nothing on stderr"
    last = err.splitlines()[-1]
    assert 0 < len(last) <= 400, f"{how}: refusal should be one clear line, got {last!r}"
    e.check_clean()


def test_it_disk_tier_and_lru(spawn, models):
    # big fixture: 8 MoE layers x 16 experts; one expert = 2 x (64 x 128 Q8_0) + 128 x 64 F16 = 33792 B
    expert_bytes = 2 * (64 * 128 // 32 * 34) + 128 * 64 * 2
    cap = (1 << 20) // expert_bytes
    e = spawn(model="big", slots=2, EXPERT_RAM_MB=1)
    e.sync()
    rows, cols, emap0 = parse_map(e.latest["EMAP"], "EMAP")
    assert (rows, cols) == (8, 16)
    vr, ram, disk, _, _ = parse_tiers(e.latest["TIERS"])
    assert disk > 0 and ram <= cap, f"EXPERT_RAM_MB=1 should leave experts on disk: {e.latest['TIERS']}"
    c = tier_counts(emap0)
    assert c[0] == disk and c[0] > 0, f"EMAP tier bits 0 for disk experts: {c} vs {e.latest['TIERS']}"
    resident = []
    for p in ("Tell me about the ocean.", "Write code for a parser."):
        r = e.generate(chatml(p), slot=0, max_tokens=40, temperature=1.0)
        _, _, emap = parse_map(r.block_line("EMAP"), "EMAP")
        vr, ram, disk, _, _ = parse_tiers(r.block_line("TIERS"))
        c = tier_counts(emap)
        assert (c[2], c[1], c[0]) == (vr, ram, disk)
        assert 0 < ram <= cap, f"RAM tier holds {ram} experts, budget allows {cap}"
        used = sum(1 for b in emap if b & 63)
        assert used > ram, f"{used} experts routed but {ram} resident: nothing went through the disk tier"
        assert r.stat()["hit_pct"] < 100.0, f"hit_pct 100 with most experts on disk: {' '.join(r.done)}"
        resident.append({i for i, b in enumerate(emap) if b >> 6 == 1})
        # frequency first (pins and the cache alike): what stays in RAM was selected more often
        # than what was routed and left on disk
        heat = [b & 63 for b in emap]
        cold = [heat[i] for i in range(len(emap)) if heat[i] and i not in resident[-1]]
        hot = [heat[i] for i in resident[-1]]
        assert cold and sum(hot) / len(hot) > sum(cold) / len(cold), (
            f"resident experts are not the hot ones: heat {sorted(hot)} in RAM vs {sorted(cold)} on disk")
    assert resident[0] and resident[1], "the RAM tier stayed empty"
    assert e.close() == 0


def _read_usage(path):
    recs = []
    for ln in open(path).read().splitlines():
        if ln.strip():
            recs.append(tuple(int(x) for x in ln.split()))
    return recs


def test_it_heat_persists_across_restart(spawn, tmp_path):
    usage = tmp_path / "usage.txt"
    e1 = spawn(slots=1, USAGE_SAVE=1, COLI_USAGE=usage)
    r = e1.generate(chatml("Remember this turn."), max_tokens=10)
    assert usage.exists(), "usage file not written at turn end"
    recs = _read_usage(usage)
    assert recs[0][:3] == (-1, 4, 8), f"first usage record should be '-1 <n_layers> <n_experts>': {recs[:2]}"
    assert recs[1][:2] == (-2, 1), f"second usage record should be '-2 1 <engine_id>': {recs[:2]}"
    counts = {(l, x): n for l, x, n in recs[2:]}
    assert all(n > 0 for n in counts.values())
    _, _, emap = parse_map(r.block_line("EMAP"), "EMAP")
    for i, b in enumerate(emap):
        want = bitlen_heat(counts.get((i // 8, i % 8), 0))
        assert b & 63 == want, f"layer {i // 8} expert {i % 8}: heat {b & 63}, usage count -> {want}"
    per_layer = [sum(n for (l, _), n in counts.items() if l == L) for L in range(4)]
    assert len(set(per_layer)) == 1, f"selections per layer differ: {per_layer}"
    fwd = per_layer[0] / 2
    s = r.stat()
    assert fwd in (s["prompt_tokens"] + s["emitted"] - 1, s["prompt_tokens"] + s["emitted"]), (
        f"{per_layer[0]} selections per layer = {fwd} tokens x top-2; prompt {s['prompt_tokens']} + {s['emitted']} emitted")
    assert e1.close() == 0
    saved = usage.read_bytes()
    e2 = spawn(slots=1, USAGE_SAVE=0, COLI_USAGE=usage)
    e2.sync()
    _, _, emap2 = parse_map(e2.latest["EMAP"], "EMAP")
    assert [b & 63 for b in emap2] == [b & 63 for b in emap], "startup EMAP heat differs from the saved usage"
    assert any(b & 63 for b in emap2)
    e2.generate(chatml("another"), max_tokens=4)
    assert e2.close() == 0
    assert usage.read_bytes() == saved, "USAGE_SAVE=0 must not write the usage file"


# ------------------------------------------------------------------------- tokenizer CLI

TEXT = "Hello, 世界! 🦜🚀 naïve café — ½ and 東京タワー 12345\n\tend <|im_start|>user"


def _cli(engine_bin, model, *args):
    env = dict(os.environ, SNAP=str(model))
    for k in ("SERVE", "SERVE_BATCH"):
        env.pop(k, None)
    p = subprocess.run([str(engine_bin), *args], env=env, capture_output=True, timeout=T)
    assert p.returncode == 0, f"{args[0]} exited {p.returncode}: {p.stderr.decode(errors='replace')[-800:]}"
    return p.stdout


def _tokenize(engine_bin, model, text, tmp_path):
    f = tmp_path / "text.txt"
    f.write_bytes(text.encode())
    out = _cli(engine_bin, model, "--tokenize", str(f)).decode().strip()
    assert "\n" not in out, f"--tokenize should print one line: {out!r}"
    return [int(x) for x in out.replace(",", " ").split()]


def test_it_detokenize_round_trip(engine_bin, models, tmp_path):
    ids = _tokenize(engine_bin, models["moe"], TEXT, tmp_path)
    assert ids and all(0 <= i < 459 for i in ids)
    assert 1 in ids, "<|im_start|> must be one atomic token (id 1)"
    out = _cli(engine_bin, models["moe"], "--detokenize", " ".join(map(str, ids)))
    if out.endswith(b"\n") and not TEXT.endswith("\n"):
        out = out[:-1]
    assert out == TEXT.encode(), f"detokenize(tokenize(x)) != x: {out!r}"


def test_it_tokenize_matches_hf(engine_bin, models, tmp_path):
    """The engine's BPE must match HF tokenizers on the fixture vocabulary (smollm pre-tokenizer)."""

    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, models as tm, pre_tokenizers as pt

    rd = GGUFReader(str(models["moe"]))
    toks = rd.fields["tokenizer.ggml.tokens"].contents()
    merges = rd.fields["tokenizer.ggml.merges"].contents()
    hf = Tokenizer(tm.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=[tuple(m.split(" ")) for m in merges]))
    hf.pre_tokenizer = pt.Sequence([pt.Digits(individual_digits=True),
                                    pt.ByteLevel(add_prefix_space=False, use_regex=True)])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in toks[:3]])
    texts = [TEXT, "The quick brown fox jumps over the lazy dog.\n\n  def main():\n    return 0\n",
             "it's we'll they've I'm  multiple   spaces\t\ttabs", chatml("What is the capital of France?")]
    problems = []
    for t in texts:
        want = hf.encode(t).ids
        got = _tokenize(engine_bin, models["moe"], t, tmp_path)
        if got != want:
            problems.append(f"{t!r}:\n  engine {got}\n  hf     {want}")
    assert not problems, "\n".join(problems)


def test_it_keeps_conversations_warm_across_restart_with_kvsave(spawn, tmp_path):
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    first = chatml("Keep this conversation warm.")
    e1 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir)
    r1 = e1.generate(first, slot=1, max_tokens=8)
    assert e1.close() == 0
    assert any(kv_dir.iterdir()), "KVSAVE=1 wrote no slot file"
    e2 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir)
    follow = first + r1.text.decode("utf-8") + "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n"
    r2 = e2.generate(follow, slot=1, max_tokens=4)
    assert r2.reused is not None and r2.reused >= r1.prompt_tokens, (
        f"after restart slot 1 reused {r2.reused} tokens, expected >= {r1.prompt_tokens}")
    other = e2.generate(follow, slot=0, max_tokens=4)
    assert other.reused == 0, "slot 0 had no saved conversation, yet reused a prefix"
    assert e2.close() == 0


def test_it_does_not_reuse_a_slot_file_saved_in_another_arithmetic(spawn, tmp_path):
    # K/V rows computed under EXACT=1 differ from the default path's: a slot file records
    # the mode (in the model fingerprint) and loads only into an engine running the same one
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    first = chatml("Keep this conversation warm.")
    e1 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir, EXACT=1)
    r1 = e1.generate(first, slot=1, max_tokens=8)
    assert e1.close() == 0
    follow = first + r1.text.decode("utf-8") + "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n"
    e2 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir)
    r2 = e2.generate(follow, slot=1, max_tokens=4)
    assert r2.reused == 0, f"a slot saved under EXACT=1 was reused ({r2.reused} tokens) by a default engine"
    assert e2.close() == 0
    e3 = spawn(slots=2, KVSAVE=1, KV_DIR=kv_dir, EXACT=1)
    r3 = e3.generate(follow, slot=1, max_tokens=4)
    assert r3.reused == 0, "the default engine's save of slot 1 should have replaced the EXACT one"
    assert e3.close() == 0


def test_it_pins_the_hottest_experts_and_reports_repin(spawn, tmp_path):
    usage = tmp_path / "usage.txt"
    e = spawn(model="big", slots=1, USAGE_SAVE=1, COLI_USAGE=usage, EXPERT_RAM_MB=1, PIN_MB=1)
    r = e.generate(chatml("Warm up the router with a few words."), max_tokens=12)
    repins = [line for line in r.block if line.startswith("REPIN ")]
    assert repins, "no REPIN line after the first turn although PIN_MB leaves room for pinned experts"
    for line in repins:
        _, layer, eid, old_tier, gpu = line.split()
        assert 0 <= int(layer) < 8 and 0 <= int(eid) < 16 and int(old_tier) in (0, 1, 2)
    assert r.stat()["emitted"] >= 1
    assert e.close() == 0


def test_it_reports_no_repin_when_every_expert_is_in_ram(spawn, tmp_path):
    # nothing moves between tiers when every expert is resident: REPIN is a tier change
    e = spawn(model="big", slots=1, USAGE_SAVE=1, COLI_USAGE=tmp_path / "usage.txt")
    for p in ("Warm up the router with a few words.", "And a second turn."):
        r = e.generate(chatml(p), max_tokens=8)
        assert not [ln for ln in r.block if ln.startswith("REPIN ")], "REPIN at full RAM"
    assert e.close() == 0


def test_it_pins_the_whole_budget_by_default(spawn, tmp_path):
    # no PIN_MB: the RAM budget is all pinned to the hottest experts (an LRU smaller than a
    # token's working set never hits), so the first turn end re-pins and the budget stays full
    expert_bytes = 2 * (64 * 128 // 32 * 34) + 128 * 64 * 2
    e = spawn(model="big", slots=1, USAGE_SAVE=0, COLI_USAGE=tmp_path / "usage.txt", EXPERT_RAM_MB=1)
    fits = (1 << 20) // expert_bytes
    r = e.generate(chatml("Warm up the router with a few words."), max_tokens=12)
    assert any(line.startswith("REPIN ") for line in r.block), "no REPIN although the budget is pinned"
    # This turn's TIERS precede its re-pin (the DONE block's order): during the turn the cache
    # never holds more than the budget, but how full it is depends on when the lookahead's
    # reads settle. The next turn's TIERS show the re-pinned budget, which nothing evicts.
    _, ram, _, _, _ = parse_tiers(r.block_line("TIERS"))
    assert ram <= fits, r.block_line("TIERS")
    r = e.generate(chatml("And a second turn."), max_tokens=2)
    _, ram, disk, _, _ = parse_tiers(r.block_line("TIERS"))
    assert ram == fits and disk == 8 * 16 - ram, r.block_line("TIERS")
    assert e.close() == 0


def test_it_sends_topk_after_each_token_when_asked(spawn):
    e = spawn(slots=1, SERVE_TOPK=1)
    r = e.generate(chatml("Name a colour."), max_tokens=6)
    seq = [(k, p) for k, p, _ in e.events[r.first_event:r.last_event + 1] if k in ("DATA", "TOPK")]
    data_n = sum(1 for k, _ in seq if k == "DATA")
    topk = [p for k, p in seq if k == "TOPK"]
    assert data_n == r.stat()["emitted"] and len(topk) == data_n, seq
    assert all(seq[i][0] == "DATA" and seq[i + 1][0] == "TOPK" for i in range(0, len(seq), 2)), seq
    for p in topk:
        assert p[1] == str(r.id) and p[2] == "5" and len(p) == 3 + 2 * 5, p
        lps = [float(x) for x in p[3::2]]
        assert lps == sorted(lps, reverse=True) and all(lp <= 0 for lp in lps), p
    # Greedy: the sampled token is the most likely candidate, so its text leads each TOPK.
    first_texts = b"".join(bytes.fromhex(p[4]) for p in topk)
    assert first_texts.decode("utf-8", "replace") == r.text.decode("utf-8")
    assert e.close() == 0


def test_a_usage_save_waits_its_turn_and_never_hangs_a_turn(spawn, tmp_path):
    """Two engines on one model file share its usage file; their saves take turns through an
    flock on <usage>.lock (two writers of one .tmp interleaved their bytes, and the next load
    threw the history away). Here another writer holds the lock past the engine's wait: the
    turn still ends at once, the save is skipped and says so, and the next turn's end, with the
    lock free, writes the history whole."""
    import fcntl
    import time

    usage = tmp_path / "usage.txt"
    e = spawn(slots=1, USAGE_SAVE=1, COLI_USAGE=usage)
    with open(f"{usage}.lock", "w") as other_writer:
        fcntl.flock(other_writer, fcntl.LOCK_EX)
        started = time.monotonic()
        first = e.generate(chatml("While another engine writes."), max_tokens=6)
        assert first.done is not None, first.errors
        assert time.monotonic() - started < 30, "the turn hung on the usage lock"
        e.wait_stderr("another engine is writing the usage file")
        assert not usage.exists(), "saved while another writer held the lock"
    second = e.generate(chatml("Now alone."), max_tokens=6)
    assert second.done is not None, second.errors
    e.sync()
    recs = _read_usage(usage)
    assert recs[0][:3] == (-1, 4, 8) and recs[1][:2] == (-2, 1), recs[:2]
    per_layer = [sum(n for l, _, n in recs[2:] if l == L) for L in range(4)]
    # both turns' selections (top-2): more than the first turn forwarded, at most both whole
    # (the second reuses the shared start of the chat template from the slot's cache)
    first_tokens = first.stat()["prompt_tokens"] + first.stat()["emitted"]
    both = first_tokens + second.stat()["prompt_tokens"] + second.stat()["emitted"]
    assert len(set(per_layer)) == 1 and first_tokens < per_layer[0] / 2 <= both, (per_layer, first_tokens, both)
    assert e.close() == 0


def test_engines_sharing_a_usage_file_merge_their_histories(spawn, tmp_path):
    """Two engines on one model file (two bridges on one host) save into one usage file. Each
    save adds that engine's selections since it last read or wrote the file to what the file
    holds then: the last writer used to replace the file with its own view, and the other
    engine's turns since were lost from the heat history. Counted per layer: every forwarded
    token makes top-2 selections in each of the 4 layers."""
    usage = tmp_path / "usage.txt"
    first = spawn(slots=1, USAGE_SAVE=1, COLI_USAGE=usage)
    second = spawn(slots=1, USAGE_SAVE=1, COLI_USAGE=usage)
    first.sync()
    second.sync()                      # both have read the (missing) file: neither has history

    def forwarded(turn):
        s = turn.stat()
        return s["prompt_tokens"] + s["emitted"]

    def per_layer():
        recs = _read_usage(usage)
        assert recs[0][:3] == (-1, 4, 8) and recs[1][:2] == (-2, 1), recs[:2]
        totals = [sum(n for l, _, n in recs[2:] if l == L) for L in range(4)]
        assert len(set(totals)) == 1, f"selections per layer differ: {totals}"
        return totals[0] / 2

    a = first.generate(chatml("The first engine's turn, about lighthouses and the sea."), max_tokens=8)
    assert a.done is not None, a.errors
    first.sync()
    ta = forwarded(a)
    assert ta - 1 <= per_layer() <= ta
    b = second.generate(chatml("The second engine's turn."), max_tokens=8)
    assert b.done is not None, b.errors
    second.sync()
    tb = forwarded(b)
    got = per_layer()
    assert ta + tb - 2 <= got <= ta + tb, (
        f"{got} tokens' selections in the file after the second engine's save: its own turn forwarded "
        f"{tb}, the first engine's {ta} (a last-writer-wins save keeps only {tb})")
    # the first engine took the merged history in at its save, and merges again: nothing is lost
    c = first.generate(chatml("Again the first."), max_tokens=4)
    assert c.done is not None, c.errors
    first.sync()
    assert ta + tb - 2 < per_layer() <= ta + tb + forwarded(c)
    assert first.close() == 0 and second.close() == 0


def test_a_usage_file_that_is_not_a_file_is_read_but_never_replaced(spawn, tmp_path):
    """USAGE_FILE=/dev/null is how a user runs without a history; a save there wrote
    /dev/null.tmp and renamed it over the device. A path that exists and is not a regular file is
    read (no history) and never written. A node of /dev/null's own device numbers stands in for it
    (mknod: the tests run as root, as make test and CI do)."""
    import os
    import stat

    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    e = spawn(slots=1, USAGE_SAVE=1, COLI_USAGE=node)
    r = e.generate(chatml("No history, please."), max_tokens=4)
    assert r.done is not None, r.errors
    e.sync()
    assert e.close() == 0
    assert stat.S_ISCHR(os.stat(node).st_mode), "the usage path was replaced by a regular file"
    assert not (tmp_path / "null.tmp").exists()
