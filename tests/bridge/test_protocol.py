import pytest

from engine_bridge import protocol as p

HANDSHAKE = (b"== GLM C engine (glm_moe_dsa), cache=8 ==\nloaded in 0.00s\n\x01\x01READY\x01\x01\n"
             b"STAT 0 0.00 0.0 0.01\nHWINFO 2 24.7 23.3 0 0.0 AMD EPYC 7B13 64-Core|\n"
             b"TIERS 0 0 16 0.00 0.00\nEMAP 2 8 00000000000000000000000000000000\n")


def ready_parser():
    parser = p.Parser()
    parser.feed(b"\x01\x01READY\x01\x01\n")
    return parser


def one(line):
    events = ready_parser().feed(line)
    assert len(events) == 1, events
    return events[0]


def test_it_skips_banner_lines_before_ready():
    events = p.Parser().feed(HANDSHAKE)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["Banner", "Banner", "Ready", "Stat", "HwInfo", "Tiers", "Emap"]
    hw = events[4]
    assert (hw.cores, hw.ram_total_gb, hw.ngpu, hw.cpu, hw.gpu) == (2, 24.7, 0, "AMD EPYC 7B13 64-Core", "")


def test_it_parses_telemetry_lines():
    assert one(b"STAT 0 0.0 0.0 0.01 0 0\n").values == [0, 0, 0, 0.01, 0, 0]
    assert one(b"CAPS vision=1\n").caps == {"vision": 1}
    assert one(b"HWINFO 8 64.0 60.1 1 24.0 Intel Xeon|CUDA device x1\n").gpu == "CUDA device x1"
    assert one(b"TIERS 0 11 5 0.00 0.00\n").disk_experts == 5
    assert one(b"EMAP 2 8 00000041414344450000434344444342\n").rows == 2
    assert one(b"HITS 2 8 F8FC\n").hex == "f8fc"
    assert one(b"GPUS 1 3.5 24.0 100\n").gpus == [{"used_gb": 3.5, "total_gb": 24.0, "experts": 100}]
    assert one(b"GPUS 0\n").gpus == []
    assert isinstance(one(b"GPUDETAIL 1 1 0 - 1 2 3 4 5 6\n"), p.GpuDetail)
    assert one(b'MODEL {"name": "tiny", "ctx": 256}\n').info == {"name": "tiny", "ctx": 256}
    assert one(b"PERF 3 0.458 0.000 0.000 0.000 0.457 0.000 0.000\n").values["dt"] == 0.458
    assert one(b"PROF 0.019 11 8 0.000 -0.000 0.000 0.010 0.000 7\n").values["forwards"] == 7
    assert one(b"ENTROPY 1.5 2.0\n").values == [1.5, 2.0]
    assert one(b"REPIN 3 7 1 0\n") == p.Repin(3, 7, 1, 0)
    assert one(b"ROUTES 4 2 16 0:3:5 1:15:1\n") == p.Routes(4, 2, 16, [[0, 3, 5], [1, 15, 1]])
    assert one(b"ROUTES 4 0 0\n") == p.Routes(4, 0, 0, [])
    assert one(b"ROUTESTEP 4 2 16 2 030f0100\n") == p.RouteStep(4, 2, 16, 2, [3, 15, 1, 0])
    assert one(b"ROUTESTEP 4 1 384 2 017f0002\n") == p.RouteStep(4, 1, 384, 2, [383, 2])  # 4 digits past 256
    topk = one(b"TOPK 4 2 -0.1 6869 -2.5 c3a9\n")
    assert topk.id == 4 and topk.candidates == [[-0.1, "hi"], [-2.5, "é"]]


def test_it_parses_iostat_and_builds_its_figures_in_one_place():
    io = one(b"IOSTAT 9 20 4000000 1000000 150 200 0.250 40 30\n")
    assert io == p.IoStat(9, 20, 4000000, 1000000, 150, 200, 0.25, 40, 30)
    assert io.figures() == {
        "id": 9, "tokens": 20, "disk_bytes": 4000000, "ideal_bytes": 1000000, "hits": 150, "acquisitions": 200,
        "stall_s": 0.25, "prefetch_issued": 40, "prefetch_used": 30,
        "disk_bytes_per_token": 200000.0, "ideal_bytes_per_token": 50000.0, "hit_pct": 75.0,
        "stall_ms_per_token": 12.5, "prefetch_accuracy_pct": 75.0}
    # Everything in RAM: nothing read, nothing prefetched; a turn of no tokens divides by nothing.
    quiet = one(b"IOSTAT 3 0 0 0 0 0 0.000 0 0\n").figures()
    assert quiet["disk_bytes_per_token"] is None and quiet["hit_pct"] is None and quiet["prefetch_accuracy_pct"] is None
    assert one(b"IOSTAT 3 8 0 8192 64 64 0.000 0 0 later=1\n").figures()["hit_pct"] == 100.0  # extra fields: later engines


def test_it_parses_request_lines():
    accept = one(b"ACCEPT 7 11 reused=4\n")
    assert (accept.id, accept.prompt_tokens, accept.extras) == (7, 11, {"reused": 4})
    assert one(b"ACCEPT 7 11\n").extras == {}
    done = one(b"DONE 1 STAT 8 428.09 96.4 0.01 11 1\n")
    assert (done.emitted, done.tok_s, done.prompt_tokens, done.length_limited) == (8, 428.09, 11, True)
    err = one(b"ERROR 5 CONTEXT_EXCEEDED 511 510\n")
    assert (err.id, err.code, err.n, err.limit) == (5, "CONTEXT_EXCEEDED", 511, 510)
    err = one(b"ERROR 5 CONTEXT_EXCEEDED prompt_tokens=900 requested=10 capacity=512\n")
    assert (err.n, err.limit) == (900, 512)
    assert one(b"ERROR 0 BAD_REQUEST\n").id == 0


def test_it_reads_payloads_by_count_across_chunks():
    parser = ready_parser()
    stream = b"DATA 1 3\n\n\xc3\xa9\nDATA 2 0\n\nTOOL 1 4\nA\nB\n\nECHO 1 2 0 -0.5 0\nxy\nDONE 1 STAT 1 1 1 1 1 0\n"
    events = []
    for i in range(len(stream)):           # one byte at a time
        events += parser.feed(stream[i:i + 1])
    assert [type(e).__name__ for e in events] == ["Data", "Data", "Tool", "Echo", "Done"]
    assert events[0].data == b"\n\xc3\xa9" and events[1].data == b""


def test_it_parses_the_logprobs_tail_of_data():
    event = one(b"DATA 1 1 -0.25 2 17 -0.25 4 -1.5\nx\n")
    assert event.logprob == -0.25 and event.top == [[17, -0.25], [4, -1.5]]


def test_it_ignores_unknown_kinds():
    events = ready_parser().feed(b"FUTURE 1 2 3\nHITS 1 8 01\nFUTURE again\n")
    assert [type(e).__name__ for e in events] == ["Hits"]


@pytest.mark.parametrize("line", [
    b"DONE 1 STAT 8 fast 96.4 0.01 11 1\n", b"DONE 1 8 1 1 1 1 1\n", b"ACCEPT x 3\n",
    b"EMAP 2 8 00\n", b"HITS 2 8 zz\n", b"STAT 0 0 0\n", b"HWINFO 2 x 1 0 0 cpu|\n",
    b"MODEL {nope\n", b"ERROR\n", b"ROUTES 1 2 16 2:0:1\n", b"ROUTES 1 2 16 0:16:1\n",
    b"ROUTES 1 2 16 0:1:0\n", b"ROUTES 1 2 16 0:1\n", b"ROUTES 1 2\n",
    b"ROUTESTEP 1 2 16 2 030f01\n", b"ROUTESTEP 1 2 16 2 030f0110\n", b"ROUTESTEP 1 2 16 2 030f01zz\n",
    b"ROUTESTEP 1 0 16 2 \n", b"ROUTESTEP 1 1 4 5 0001020304\n", b"ROUTESTEP 1 1 16 2 0001 x\n", b"TIERS 1 2\n", b"GPUS 2 1 2 3\n", b"DATA 1 -1\n", b"PROF 1 2 nan 4 5 6 7 8 9\n",
    b"IOSTAT 1 2 3 4 5 6 0.1 7\n", b"IOSTAT 0 2 3 4 5 6 0.1 7 8\n", b"IOSTAT 1 2 -3 4 5 6 0.1 7 8\n",
    b"IOSTAT 1 2 3 4 5 6 nan 7 8\n", b"IOSTAT 1 2 3 4 5 6 -0.1 7 8\n", b"IOSTAT 1 2 3 4 7 6 0.1 7 8\n",
    b"IOSTAT 1 2 3 4.5 5 6 0.1 7 8\n",
])
def test_it_raises_on_malformed_known_lines(line):
    with pytest.raises(p.ProtocolError):
        ready_parser().feed(line)


def test_it_raises_when_a_payload_is_not_followed_by_newline():
    with pytest.raises(p.ProtocolError):
        ready_parser().feed(b"DATA 1 2\nabX")


def test_it_decodes_hits_lsb_first_and_emap_cells():
    assert p.hit_indices("f8fc") == [3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]
    assert p.hit_bit("f8fc", 3) and not p.hit_bit("f8fc", 2)
    assert p.emap_cells("0045c1") == [(0, 0), (1, 5), (3, 1)]


def test_it_formats_submit():
    data = p.format_submit(3, 1, "héllo\n", 16, 0.7, 1.0, slots=2)
    assert data == "SUBMIT 3 1 7 16 0.7 1\nhéllo\n\n".encode()
    assert p.format_submit(1, 0, "x", 1, 0.00001, 0.9, slots=1).startswith(b"SUBMIT 1 0 1 1 0.00001 0.9\n")
    assert p.format_stop(4) == b"STOP 4\n" and p.format_cancel(4) == b"CANCEL 4\n"


def test_it_writes_extension_fields_only_when_they_differ_from_the_default():
    plain = p.format_submit(2, 0, "x", 4, 0, 1, slots=1, routes=False, heat=True)
    assert plain.split(b"\n")[0] == b"SUBMIT 2 0 1 4 0 1"
    header = p.format_submit(2, 0, "x", 4, 0, 1, slots=1, seed=9, experts=3, routes=True, heat=False)
    assert header.split(b"\n")[0] == b"SUBMIT 2 0 1 4 0 1 seed=9 experts=3 routes=1 heat=0"
    steps = p.format_submit(2, 0, "x", 4, 0, 1, slots=1, routes=True, route_steps=True)
    assert steps.split(b"\n")[0] == b"SUBMIT 2 0 1 4 0 1 routes=2"


@pytest.mark.parametrize("kwargs", [
    {"req_id": 0}, {"slot": 2}, {"slot": -1}, {"payload": "a\x00b"}, {"payload": b"\xff"},
    {"payload": "x" * (16 * 1024 * 1024 + 1)}, {"max_tokens": 0}, {"temperature": 2.5},
    {"temperature": float("nan")}, {"top_p": 0}, {"top_p": float("inf")},
])
def test_it_validates_submit_before_writing(kwargs):
    args = {"req_id": 1, "slot": 0, "payload": "hi", "max_tokens": 4, "temperature": 0, "top_p": 1}
    args.update(kwargs)
    with pytest.raises(p.SubmitError):
        p.format_submit(args["req_id"], args["slot"], args["payload"], args["max_tokens"],
                        args["temperature"], args["top_p"], slots=2)
    with pytest.raises(p.SubmitError):
        p.format_stop(0)
