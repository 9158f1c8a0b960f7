"""Routing split by phase on the real engine (fixture model, 4 MoE layers x 8 experts, top-2):
done.routing's `phases` (engine_bridge.route_phases, from the engine's ROUTESTEP lines).

Which output: a random-weight model never closes a `<think>`, so a CGD1 grammar (the engine's
constrained decoding) forces one: the prompt opens `<think>` as a Qwen3-style template does,
the output is a thought, `</think>`, and an answer. Which tokens are thinking is then worked out
here from the tokens' own bytes (logprobs=1), not from the bridge's splitter: every token that
starts before `</think>` is complete."""
import asyncio

from engine_bridge import grammar
from engine_bridge.client import GenerationRequest
from tests.bridge.helpers import collect, final

ROWS, COLS, TOP_K = 4, 8, 2
PROMPT = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n"
THOUGHT, ANSWER = "Two and two make four, so the sum is four.", "It is 4, as two plus two is four."
OUTPUT = f"{THOUGHT}\n</think>\n\n{ANSWER}"
RESET = "Something else entirely."  # a prompt that shares no prefix with PROMPT


def dense(triples):
    cells = [0] * (ROWS * COLS)
    for row, expert, n in triples:
        cells[row * COLS + expert] += n
    return cells


def row_sums(cells):
    return [sum(cells[r * COLS:(r + 1) * COLS]) for r in range(ROWS)]


def token_bytes(events):
    """Every generated token's bytes, in order (logprobs entries ride on text events and done)."""
    entries = [lp for e in events if e["kind"] in ("text", "done") for lp in e.get("logprobs", [])]
    return [bytes(lp["bytes"]) for lp in entries]


async def run(prompt, **kw):
    return await collect(GenerationRequest(prompt=prompt, temperature=0, routes=True, heat=False,
                                           conversation_key="route-phases", **kw), timeout=120)


def test_phases_split_the_turn_at_the_thinking_end(real_bridge):
    async def go():
        turn = await run(PROMPT, max_tokens=200, reasoning="think", logprobs=1,
                         grammar=grammar.compile_node(grammar.lit(OUTPUT)))
        await run(RESET, max_tokens=1)  # the slot forgets PROMPT: the probe prefills it all
        probe = await run(PROMPT, max_tokens=1)
        return turn, probe
    turn, probe = asyncio.run(go())
    done, probe_done = final(turn), final(probe)
    assert done["kind"] == "done" and probe_done["kind"] == "done", (done, probe_done)
    assert done["reused"] == 0 and probe_done["reused"] == 0, (done["reused"], probe_done["reused"])

    tokens = token_bytes(turn)
    assert b"".join(tokens).decode() == OUTPUT and len(tokens) == done["usage"]["completion_tokens"]
    close_end = OUTPUT.encode().index(b"</think>") + len(b"</think>")
    starts = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    thinking = sum(1 for s in starts if s < close_end)
    answer = len(tokens) - thinking - 1  # the grammar's last token ends the turn unforwarded
    assert thinking >= 5 and answer >= 5, (thinking, answer)

    routing = done["routing"]
    assert (routing["rows"], routing["cols"]) == (ROWS, COLS)
    phases, positions = routing["phases"], routing["positions"]
    assert set(phases) == {"prompt", "thinking", "answer"}
    prompt_tokens = done["usage"]["prompt_tokens"]
    assert positions == {"prompt": prompt_tokens, "thinking": thinking, "answer": answer}, positions
    assert done["reasoning_tokens"] == thinking

    whole = dense(routing["counts"])
    split = {name: dense(triples) for name, triples in phases.items()}
    assert [a + b + c for a, b, c in zip(split["prompt"], split["thinking"], split["answer"])] == whole
    for name, n in positions.items():  # every position picked TOP_K experts in every layer
        assert row_sums(split[name]) == [TOP_K * n] * ROWS, (name, row_sums(split[name]), n)
    # The prompt phase is the prefill alone: a max_tokens=1 turn's routing on the same prompt.
    assert split["prompt"] == dense(probe_done["routing"]["counts"])
    assert probe_done["routing"]["phases"]["answer"] == [] and "thinking" not in probe_done["routing"]["phases"]
    assert split["thinking"] != split["answer"]  # different tokens, different experts (seen on this model)


def test_a_thinking_budgets_two_legs_add_up(real_bridge):
    """think_budget: the bridge STOPs the thinking and goes on in the same slot with the close of
    the thinking; the continuation's prefill counts as thinking, and the phases of both legs
    still add up to the counts of both."""
    async def go():
        await run(RESET, max_tokens=1)  # PROMPT is prefilled whole
        # headroom: the first leg runs on until the bridge's STOP lands, which on a loaded host
        # took all of 40 tokens and left the answer leg nothing
        return await run(PROMPT, max_tokens=400, reasoning="think", think_budget=8)
    events = asyncio.run(go())
    done = final(events)
    assert done["kind"] == "done", done
    routing, usage = done["routing"], done["usage"]
    phases, positions = routing["phases"], routing["positions"]
    assert positions["prompt"] == usage["prompt_tokens"] and positions["answer"] >= 1, positions
    # the first leg's thinking tokens, and the continuation's prefill (the close and the token the
    # first leg sampled last, which it did not forward) on top
    assert positions["thinking"] > done["reasoning_tokens"] >= 8, (positions, done["reasoning_tokens"])
    split = {name: dense(triples) for name, triples in phases.items()}
    assert [a + b + c for a, b, c in zip(split["prompt"], split["thinking"], split["answer"])] == dense(routing["counts"])
    for name, n in positions.items():
        assert row_sums(split[name]) == [TOP_K * n] * ROWS, (name, row_sums(split[name]), n)
