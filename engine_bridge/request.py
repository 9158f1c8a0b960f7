"""A generation request as both sides of the bridge hold it: the dataclass a surface fills and
the bridge runs, its wire form, and the rules for the text a client may send.

Why its own module: the web side (engine_bridge.client) builds requests and the engine side
(engine_bridge.jobs, .engine) runs them; neither side imports the other (the contracts in
pyproject.toml), so what they share lives here and imports nothing of the bridge.
"""
import base64
from dataclasses import asdict, dataclass, field


@dataclass
class GenerationRequest:
    prompt: str                      # fully rendered prompt (the caller renders the chat template)
    max_tokens: int
    temperature: float | None = 0.0  # 0 = greedy; None = the served model's default (sampling.model_defaults)
    top_p: float | None = 1.0        # None = the served model's default
    seed: int | None = None          # sent as seed=<n> to engines with our extensions (MODEL line)
    stop: list[str] = field(default_factory=list)
    conversation_key: str | None = None
    priority: str = "interactive"    # or "background"
    topk: bool = False
    experts: int | None = None       # routed experts per token (our engine's experts=N); None = the model's own
    routes: bool = False             # ask for this request's expert selection counts (done.routing)
    heat: bool = True                # False: the engine keeps these selections out of its usage heat
    top_k: int | None = None         # sample among the k most likely tokens (our engine's top_k=); None: no cut
    logprobs: int = 0                # k > 0: each text event carries its tokens' logprobs and k candidates
    grammar: bytes | None = None     # CGD1 DFA (engine_bridge.grammar) the output must stay in; only
                                     # for an engine that announces it (MODEL "grammar"), else refused
    model: str | None = None         # a served model id (ServedModel.id; "default"/"colibri" too);
                                     # None: the default model. The router picks its bridge.
    reasoning: str | None = None     # the output's reasoning format (engine_bridge.reasoning.mode_for
                                     # of the served template): "think" | "harmony" | None (all answer).
                                     # Set: thinking comes as `reasoning` events, `text` is the answer only
    think_budget: int | None = None  # with `reasoning`: thinking tokens at most; then the bridge closes the
                                     # thinking itself (STOP, and the same slot goes on from the prompt,
                                     # the output so far and the format's close: its KV prefix is kept)


def job_message(request: GenerationRequest) -> dict:
    """The job as JSON-able data: the grammar's bytes travel as base64 (jobs.parse_job decodes);
    `model` stays here (it chose the bridge, which serves one)."""
    job = asdict(request)
    job.pop("model", None)
    if job.get("grammar") is not None:
        job["grammar"] = base64.b64encode(bytes(job["grammar"])).decode("ascii")
    return job


def encodable(text: object) -> bool:
    """True when text can go on the wire as UTF-8: a str without lone surrogates (JSON parsers
    accept those; the engine, the database and every encoder after them do not)."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# The bridge's bounds on stop strings (the surfaces may bound tighter, api.surfaces): the stop
# automaton of the largest accepted list (8,192 characters) builds in about 15 ms, once per request.
MAX_STOPS = 32          # stop strings per request (OpenAI allows 4; Anthropic documents none)
MAX_STOP_CHARS = 256    # characters per stop string

NUL_REFUSAL = "contains a NUL character (U+0000), which this server does not accept in text"


def has_nul(text: object) -> bool:
    """True when a client's text holds U+0000: PostgreSQL text and jsonb cannot store it and the
    engine refuses it in a prompt, so every surface refuses it up front with NUL_REFUSAL naming the
    field (one rule everywhere: websocket frames, every /v1 body, titles and key names), never a
    server error later. Model output is not client text: chat.text.storable replaces it."""
    return isinstance(text, str) and "\x00" in text
