"""A submitted job as the bridge takes it: validated into a GenerationRequest, checked against
what the running engine can honour, and the bridge's record of the request while it lives.

Why here: every part of the bridge (engine_bridge.admission, .streams, .pacing) reads and writes
the same per-request record, and none of them owns the others; the record and the rules that
admit a job belong to no one part.

Invariant: a job that parse_job returns formats into a SUBMIT the engine accepts (the numbers'
wire form is decided once, by engine_bridge.sampling and protocol.format_submit), so the engine
never refuses a header in the middle of its input.
"""
import base64
import binascii
import codecs
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from engine_bridge import protocol as p
from engine_bridge import sampling
from engine_bridge.request import GenerationRequest, encodable
from engine_bridge.reasoning import MODES as REASONING_MODES, Splitter
from engine_bridge.route_phases import PhaseRouting
from engine_bridge.request import MAX_STOP_CHARS, MAX_STOPS
from engine_bridge.stops import StopMatcher

JOB_FIELDS = set(GenerationRequest.__dataclass_fields__)
# Job fields that travel as key=value extensions (our engine only), with the value that sends none.
EXTENSION_DEFAULTS = {"seed": None, "experts": None, "routes": False, "heat": True, "top_k": None, "logprobs": 0}
GRAMMAR_FORMAT = "CGD1"  # the grammar wire format our engine announces (MODEL "grammar")
GRAMMAR_REFUSAL = ("constrained decoding is not supported by this engine (structured output needs an engine "
                   "that announces the CGD1 grammar extension)")
# The job of a submit refused before its job could be read (BAD_REQUEST): it never runs.
UNREAD_JOB = GenerationRequest(prompt="", max_tokens=1)


@dataclass
class Request:
    req: str
    job: GenerationRequest
    reply_to: str = ""       # the client's reply list (transport.reply_key); its own req if none named
    leased: bool = False     # its requester holds a lease (transport.lease_key) the bridge checks
    t_submit: float = field(default_factory=time.monotonic)
    eng_id: int | None = None
    slot: int | None = None
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    text: str = ""           # decoded output so far
    tokens: int = 0          # DATA lines so far (one per token)
    sent: int = 0            # chars of text already emitted
    stopped: bool = False    # a stop string matched (STOP sent): drop further DATA
    matcher: StopMatcher | None = None  # the job's stop strings' automaton (built at the first text)
    stop_sequence: str | None = None  # the client's stop string that matched
    cancelled: bool = False  # CANCEL sent: drop further DATA, wait for CANCELLED or DONE
    t_first: float | None = None
    t_first_wall: float | None = None  # unix time of the first text: where latency is measured from
    prompt_tokens: int | None = None
    reused: int | None = None
    topk: list = field(default_factory=list)
    lp_pending: list = field(default_factory=list)  # logprob entries of tokens whose text is not sent yet
    perf: dict | None = None
    routing: PhaseRouting | None = None  # the engine's ROUTES (and steps) for this turn (routes=True)
    io: dict | None = None       # the engine's IOSTAT for this turn, as IoStat.figures()
    outbox: list = field(default_factory=list)
    seq: int = 0
    sending: bool = False    # a batch of this request is on its way to Redis
    waiting: dict | None = None  # that batch while it still waits for its list's sender (events may join it)
    text_sent_at: float | None = None  # when a batch with text last left (the frame-rate floor)
    position: int | None = None
    admitted: int = 0        # the bridge's ordinal of its admission (0: refused before admission)
    split: Splitter | None = None  # the job's reasoning splitter (engine_bridge.reasoning), made at admission
    reasoning_tokens: int = 0  # DATA tokens spent inside thinking
    raw: bytes = b""         # the output as the engine wrote it (a thinking budget's continuation prompt)
    budget_cut: bool = False  # the thinking budget is spent: STOP sent, the continuation starts at DONE
    earlier_tokens: int = 0  # tokens of the legs before a budget continuation


def parse_job(raw: object, model_info: dict | None = None) -> GenerationRequest:
    """The submit's `job` as a GenerationRequest; p.SubmitError (a ValueError) naming the field
    for one the engine would refuse, TypeError for unknown shapes."""
    if raw is not None and not isinstance(raw, dict):  # was an AttributeError, past the BAD_REQUEST answer
        raise TypeError("job must be an object")
    job = GenerationRequest(**{k: v for k, v in (raw or {}).items() if k in JOB_FIELDS})
    if not isinstance(job.prompt, str) or not job.prompt:
        raise p.SubmitError("prompt must be a non-empty string")
    if not isinstance(job.stop, list) or not all(isinstance(s, str) and s for s in job.stop):
        raise p.SubmitError("stop must be a list of non-empty strings")
    if len(job.stop) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in job.stop):
        raise p.SubmitError(f"stop: at most {MAX_STOPS} strings of at most {MAX_STOP_CHARS} characters")
    if not all(encodable(s) for s in (job.prompt, *job.stop)):
        raise p.SubmitError("prompt and stop must be valid UTF-8 (no lone surrogates)")
    # The wire form of every number, decided by the one owner of the rules: a value the engine
    # would refuse in the header must never reach it (that refusal is a stream-level ERROR 0).
    try:
        job.temperature, job.top_p, job.seed = sampling.sampling_validate(
            temperature=job.temperature, top_p=job.top_p, seed=job.seed,
            defaults=sampling.model_defaults(model_info))
    except sampling.SamplingError as exc:
        raise p.SubmitError(exc.message) from None
    if job.experts is not None and (isinstance(job.experts, bool) or not isinstance(job.experts, int)):
        raise p.SubmitError("experts must be an integer")
    if job.reasoning not in (None, *REASONING_MODES):
        raise p.SubmitError(f"reasoning must be null or one of {', '.join(REASONING_MODES)}")
    if job.think_budget is not None and (isinstance(job.think_budget, bool) or not isinstance(job.think_budget, int)
                                         or job.think_budget < 1 or job.reasoning is None):
        raise p.SubmitError("think_budget must be a positive integer, with reasoning set")
    for name in ("routes", "heat", "topk"):
        if not isinstance(getattr(job, name), bool):
            raise p.SubmitError(f"{name} must be true or false")
    if job.grammar is not None:
        try:
            job.grammar = base64.b64decode(job.grammar, validate=True) if isinstance(job.grammar, str) else None
        except (binascii.Error, ValueError):
            job.grammar = None
        if not job.grammar:
            raise p.SubmitError("grammar must be non-empty base64 (engine_bridge.request.job_message)")
    p.format_submit(1, 0, job.prompt, job.max_tokens, job.temperature, job.top_p, slots=1, top_k=job.top_k,
                    logprobs=job.logprobs, grammar=job.grammar)
    return job


def extension_refusal(job: GenerationRequest, model_info: dict | None) -> str | None:
    """Why the running engine cannot honour this job's extension fields, or None. An engine
    without a MODEL line (the real colibri binary) takes no key=value fields: refused, never
    silently dropped. The expert count is checked against the range the MODEL line announced."""
    if job.grammar is not None and (model_info or {}).get("grammar") != GRAMMAR_FORMAT:
        return GRAMMAR_REFUSAL
    if model_info is None:
        for name, default in EXTENSION_DEFAULTS.items():
            if getattr(job, name) != default:
                return f"{name} is not supported by this engine"
        return None
    if job.experts is not None:
        low, high = model_info.get("experts_min") or 0, model_info.get("experts_max") or 0
        if not high:
            return "experts: this model has no routed experts to choose"
        if not low <= job.experts <= high:
            return f"experts must be in [{low}, {high}] for this model"
    return None


def started_facts() -> dict:
    """What the bridge knows of the model of an engine that does not describe itself."""
    from pathlib import Path

    snap = Path(str(settings.ENGINE_MODEL))  # a GGUF file, or a model folder (colibri's SNAP)
    name = snap.name.removesuffix(".gguf")
    return {"name": name, "file": str(snap), "ctx": settings.ENGINE_CTX,
            "slots": settings.KV_SLOTS, "extensions": False}
