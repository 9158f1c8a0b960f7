"""A running request's engine events turned into its client events: ACCEPT, DATA (incremental
UTF-8, logprobs), TOPK, PERF / ROUTES / ROUTESTEP / IOSTAT for its done event, stop strings, and its end
(DONE, ERROR, or the engine's death); mux-protocol.md §12 items 10, 11, 14–16.

Why stop strings here: a stop string is the bridge's job (the engine knows only token ids), and
it has to cut the text before the text leaves; matching is linear in the text
(engine_bridge.stops), so no stop list can stall the loop every stream shares.

Invariants: no text past a matched stop string and none after CANCEL reaches the client; the
tail that may still grow into a stop string is held back until it cannot (or the stream ends);
every end both finishes the request and releases its slot, except BAD_FRAME (the engine exits;
its death ends the request).
"""
import codecs
import logging
from collections.abc import Callable
from dataclasses import replace

from engine_bridge import protocol as p
from engine_bridge.admission import CANCELLED, Admission
from engine_bridge.jobs import Request
from engine_bridge.pacing import Pacer
from engine_bridge.route_phases import ANSWER, THINKING
from engine_bridge.stops import StopMatcher
from engine_bridge.telemetry_events import EngineTelemetry

log = logging.getLogger(__name__)

# What ends the thinking when its budget is spent, per reasoning format (engine_bridge.reasoning).
THINK_CLOSES = {"think": "\n</think>\n\n", "harmony": "<|end|><|start|>assistant<|channel|>final<|message|>"}
DIED_MESSAGE = "The engine stopped unexpectedly while generating; it is restarting."


def token_text(raw: bytes) -> str:
    """A token's bytes as the text OpenAI's logprobs name it: the UTF-8 text, or `bytes:\\xNN…`
    for a piece that is not valid UTF-8 on its own (half a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def logprob_entry(ev: p.Data) -> dict:
    """A DATA event's logprobs tail (lptext=1) -> {token, logprob, bytes, top: [{token, logprob, bytes}]}."""
    raw = ev.token_bytes or b""
    top = [{"token": token_text(b), "logprob": lp, "bytes": list(b)}
           for (tid, lp), b in zip(ev.top or [], ev.top_bytes or []) if tid >= 0]
    return {"token": token_text(raw), "logprob": ev.logprob, "bytes": list(raw), "top": top}


def error_final(ev: p.Error) -> dict:
    """The client's final event for an engine ERROR of its request."""
    if ev.code == "CANCELLED":
        return dict(CANCELLED)
    if ev.code == "CONTEXT_EXCEEDED":
        return {"kind": "error", "code": "CONTEXT_EXCEEDED", "n": ev.n, "limit": ev.limit,
                "message": f"The prompt is too long: at least {ev.n} tokens, the limit is {ev.limit}."}
    if ev.code in ("BAD_REQUEST", "EMPTY_PROMPT"):
        return {"kind": "error", "code": "BAD_REQUEST", "message": ev.message}
    if ev.code in ("SLOT_BUSY", "DUPLICATE_ID"):
        log.error("bridge bug: engine said %s for id %s", ev.code, ev.id)
    return {"kind": "error", "code": "ENGINE_ERROR", "message": ev.message}


class Streams:
    def __init__(self, admission: Admission, pacer: Pacer, telemetry: EngineTelemetry) -> None:
        self.admission, self.pacer, self.telemetry = admission, pacer, telemetry

    def handlers(self) -> dict[type, Callable]:
        """Event type -> handler, for the per-request engine events."""
        return {p.Accept: self.accept, p.Data: self.data, p.TopK: self.topk, p.Perf: self.perf,
                p.Routes: self.routes, p.RouteStep: self.routestep, p.IoStat: self.iostat, p.Done: self.done, p.Error: self.error}

    def emit_text(self, r: Request, final: bool = False) -> None:
        """Sends the new text, holding back a tail that may still grow into a stop string; a
        complete stop string cuts the text there and STOPs the engine."""
        if not r.stopped and r.job.stop:
            if r.matcher is None:
                r.matcher = StopMatcher(r.job.stop)
            hit = r.matcher.feed(r.text[r.matcher.pos:])
            if hit:
                cut, r.stop_sequence = hit
                self.pacer.emit(r, {"kind": "text", "text": r.text[r.sent:cut]})
                r.sent, r.text = cut, r.text[:cut]
                self.admission.stop(r)
                return
        held = r.matcher.held if r.matcher is not None else 0
        end = len(r.text) if final or r.stopped else len(r.text) - held
        if end > r.sent:
            self.pacer.emit(r, {"kind": "text", "text": r.text[r.sent:end]})
            r.sent = end

    def take(self, r: Request, piece: str, final: bool = False, end_token: bool = False) -> None:
        """New decoded output of r: all answer, or (a reasoning job) split into `reasoning`
        events, sent as they come, and answer text, which goes through the stop strings. The
        splitter's end of output (harmony's <|return|> / <|call|>) STOPs the engine. end_token:
        the engine ended the output at an end-of-generation token (not written as text)."""
        split = r.split
        if split is None:
            r.text += piece
            self.emit_text(r, final=final)
            return
        segments = split.feed(piece) + (split.finish(end_token) if final else [])
        for kind, text in segments:
            if r.stopped:  # a stop string cut the answer: nothing after it goes out
                break
            if kind == "reasoning":
                self.pacer.emit(r, {"kind": "reasoning", "text": text})
            else:
                r.text += text
                self.emit_text(r)
        if final and not r.stopped:
            self.emit_text(r, final=True)
        if split.ended and not (final or r.stopped or r.cancelled):  # at the final piece the engine has ended
            self.admission.stop(r)

    def engine_down(self) -> None:
        """The engine died: each running request gets its text so far, then ENGINE_DIED."""
        for r in list(self.admission.running.values()):
            self.flush(r)
            self.emit_text(r, final=True)
            self.admission.finish(r, {"kind": "error", "code": "ENGINE_DIED", "message": DIED_MESSAGE})

    def flush(self, r: Request) -> None:
        """What r's splitter still holds, at an end that is not DONE (an error, the engine's death)."""
        if r.split is not None and not (r.stopped or r.cancelled):
            self.take(r, "", final=True)

    def accept(self, ev: p.Accept) -> None:
        r = self.admission.running.get(ev.id)
        if r is not None and r.routing is not None:  # every leg's: its prefill's positions
            r.routing.accept(ev.prompt_tokens, ev.extras.get("reused"))
        if r is None or r.prompt_tokens is not None:
            if r is not None and not r.earlier_tokens:  # a budget continuation's ACCEPT is expected
                log.error("duplicate ACCEPT for id %s", ev.id)
            return
        r.prompt_tokens, r.reused = ev.prompt_tokens, ev.extras.get("reused")
        self.pacer.emit(r, {"kind": "accepted", "prompt_tokens": ev.prompt_tokens, "slot": r.slot,
                            "reused": r.reused, "admitted": r.admitted})

    def data(self, ev: p.Data) -> None:
        r = self.admission.running.get(ev.id)
        if r is None:
            return
        if r.cancelled or r.stopped or r.budget_cut:
            if r.routing is not None:  # the engine still forwards it: its phase is its predecessor's
                r.routing.token(None)
            return
        r.tokens += 1
        if r.job.logprobs and ev.logprob is not None:
            r.lp_pending.append(logprob_entry(ev))
        thinking = r.split is not None and r.split.thinking
        if r.job.think_budget is not None:
            r.raw += ev.data
        self.take(r, r.decoder.decode(ev.data))
        thinking = thinking or (r.split is not None and r.split.thinking)
        if r.routing is not None:
            r.routing.token(THINKING if thinking else ANSWER)
        if thinking:
            r.reasoning_tokens += 1
            budget = r.job.think_budget
            if budget is not None and r.reasoning_tokens >= budget and r.split is not None and r.split.closable:
                r.budget_cut = True  # the thinking is over budget: this leg stops here (done continues)
                self.admission.stop_leg(r)

    def topk(self, ev: p.TopK) -> None:
        r = self.admission.running.get(ev.id)
        if r and r.job.topk and not (r.cancelled or r.stopped):
            r.topk.append(ev.candidates)
            self.pacer.emit(r, {"kind": "topk", "candidates": ev.candidates})

    def perf(self, ev: p.Perf) -> None:
        r = self.admission.running.get(ev.id)
        if r:
            r.perf = ev.values

    def routes(self, ev: p.Routes) -> None:
        r = self.admission.running.get(ev.id)
        if r and r.routing is not None:
            r.routing.routes(ev)

    def routestep(self, ev: p.RouteStep) -> None:
        r = self.admission.running.get(ev.id)
        if r and r.routing is not None:
            r.routing.step(ev)

    def iostat(self, ev: p.IoStat) -> None:
        figures = self.telemetry.iostat(ev)
        r = self.admission.running.get(ev.id)
        if r:
            r.io = figures

    def done(self, ev: p.Done) -> None:
        block = self.telemetry.end_turn(ev)
        r = self.admission.running.get(ev.id)
        if r is None:
            return
        if r.cancelled:
            self.admission.finish(r, dict(CANCELLED))
            return self.admission.release(r)
        if r.budget_cut and not r.stopped and self.continue_after_budget(r, ev):
            return
        if not r.stopped:
            self.take(r, r.decoder.decode(b"", final=True), final=True, end_token=not ev.length_limited)
        self.emit_text(r, final=True)
        self.admission.finish(r, self.done_event(r, ev, block))
        self.admission.release(r)

    def continue_after_budget(self, r: Request, ev: p.Done) -> bool:
        """The thinking budget was spent: the same slot goes on from the prompt, the output so far
        and the format's close of the thinking (the engine reuses that KV prefix), so the model
        answers. False when no budget is left for an answer (the request then ends as a length
        stop). The engine cannot be told to close the thinking itself, hence the second leg."""
        assert r.split is not None and r.slot is not None  # a budget needs a reasoning job, and r runs
        left = r.job.max_tokens - r.earlier_tokens - ev.emitted
        if left < 1:
            return False
        close = THINK_CLOSES[r.job.reasoning or ""]
        r.earlier_tokens += ev.emitted
        r.budget_cut = False
        for kind, text in r.split.feed(close):  # the splitter leaves the thinking with the model
            if kind == "text":
                r.text += text
        prompt = r.job.prompt + r.raw.decode("utf-8", "replace") + close
        r.raw = b""
        r.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        r.job = replace(r.job, prompt=prompt, max_tokens=left, think_budget=None)
        self.admission.running.pop(ev.id, None)
        self.admission.start(r, r.slot)
        return True

    def done_event(self, r: Request, ev: p.Done, block: dict) -> dict:
        """r's done event: DONE's figures, what r collected, the turn's telemetry block."""
        ttft = round(r.t_first - r.t_submit, 4) if r.t_first else None
        return {
            "kind": "done",
            "finish_reason": "length" if ev.length_limited and not r.stopped else "stop",
            "stop_sequence": r.stop_sequence,
            "usage": {"prompt_tokens": r.prompt_tokens if r.earlier_tokens else ev.prompt_tokens,
                      "completion_tokens": r.earlier_tokens + ev.emitted},
            "reasoning_tokens": r.reasoning_tokens,
            "stats": {"tok_s": ev.tok_s, "hit_pct": ev.hit_pct, "rss_gb": ev.rss_gb, "ttft_s": ttft,
                      "first_token_at": r.t_first_wall},
            "reused": r.reused,
            "perf": r.perf or block.get("prof"),
            "entropy": block.get("entropy"),
            "gpus": block.get("gpus"),
            "repin": block.get("repin", []),
            "topk": r.topk if r.job.topk else None,
            "routing": r.routing.summary() if r.routing is not None else None,
            "io": r.io,
            **({"logprobs": r.lp_pending} if r.lp_pending else {}),  # tokens whose text was empty or held
        }

    def error(self, ev: p.Error) -> None:
        r = self.admission.running.get(ev.id)
        if r is None or ev.code == "NOT_FOUND":
            if ev.id != 0 and ev.code != "NOT_FOUND":
                log.error("engine error for unknown id %s: %s", ev.id, ev.message)
            return
        final = error_final(ev)
        if ev.code == "BAD_FRAME":
            return  # the engine exits; on_down reports ENGINE_DIED
        self.flush(r)
        self.emit_text(r, final=True)
        self.admission.finish(r, final)
        self.admission.release(r)
