"""Reasoning split by the bridge (job field `reasoning`), against the scripted mux engine (a test
double: a random-weight model never writes `<think>` or a harmony channel; FAKE_SCRIPT=1 makes
the prompt's last `<<SAY>>…<</SAY>>` the output, two bytes per DATA frame, so every marker
arrives cut)."""
from engine_bridge.request import GenerationRequest
from tests.bridge.helpers import collect, final, text_of
from tests.bridge.test_worker_fake_engines import bridge


def reasoning_of(events):
    return "".join(e["text"] for e in events if e["kind"] == "reasoning")


def say(text, tail=""):
    return f"<|im_start|>user\nq <<SAY>>{text}<</SAY>><|im_end|>\n<|im_start|>assistant\n{tail}"


THINK = "<think>\nThe user says hi.\nGreet back.\n</think>\n\n"
HARMONY = ("<|channel|>analysis<|message|>User greets; keep it short.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>Hello there!<|return|>NEVER SHOWN")


async def test_think_output_is_split_and_counted(redis_url):
    with bridge(redis_url, "mux_fake.py", FAKE_SCRIPT="1", FAKE_DELAY="0.001", CTX="4096"):
        events = await collect(GenerationRequest(prompt=say(THINK + "Hi! stop here"), max_tokens=500,
                                                 reasoning="think", stop=["stop"]))
        done = final(events)
        assert done["kind"] == "done", done
        assert reasoning_of(events) == "The user says hi.\nGreet back."
        assert text_of(events) == "Hi! "  # the stop string cuts the answer
        assert done["finish_reason"] == "stop" and done["stop_sequence"] == "stop"
        think_tokens = len(THINK.encode()) / 2
        assert think_tokens - 2 <= done["reasoning_tokens"] <= think_tokens + 1
        # a stop string inside the thinking does not end the answer
        events = await collect(GenerationRequest(prompt=say("<think>say stop</think>fine"), max_tokens=500,
                                                 reasoning="think", stop=["stop"]))
        assert reasoning_of(events) == "say stop" and text_of(events) == "fine"
        # a prompt that opened <think> starts inside the thinking
        events = await collect(GenerationRequest(prompt=say("deep\n</think>\n\nok", "<think>\n"), max_tokens=500,
                                                 reasoning="think"))
        assert reasoning_of(events) == "deep" and text_of(events) == "ok"
        # no reasoning field: the output is all answer, as before
        plain = await collect(GenerationRequest(prompt=say(THINK + "Hi"), max_tokens=500))
        assert text_of(plain) == THINK + "Hi" and final(plain)["reasoning_tokens"] == 0


async def test_harmony_channels_end_at_return(redis_url):
    with bridge(redis_url, "mux_fake.py", FAKE_SCRIPT="1", FAKE_DELAY="0.01", CTX="4096"):
        prompt = f"<|start|>user<|message|>hi <<SAY>>{HARMONY}<</SAY>><|end|><|start|>assistant"
        events = await collect(GenerationRequest(prompt=prompt, max_tokens=500, reasoning="harmony"))
        done = final(events)
        assert done["kind"] == "done" and done["finish_reason"] == "stop", done
        assert reasoning_of(events) == "User greets; keep it short."
        assert text_of(events) == "Hello there!"
        # the bridge stopped the engine at <|return|>: the script's tail was never generated
        assert done["usage"]["completion_tokens"] < len(HARMONY.encode()) / 2
        assert done["reasoning_tokens"] > 0


async def test_a_thinking_budget_closes_the_thinking_and_the_model_answers(redis_url):
    """think_budget: at the budget the bridge STOPs and goes on in the same slot from the prompt,
    the output so far and the close; the scripted engine says <<THEN>> for that continuation."""
    long_thought = "<think>\n" + "I keep thinking about this. " * 20 + "\n</think>\n\nnever said"
    with bridge(redis_url, "mux_fake.py", FAKE_SCRIPT="1", FAKE_DELAY="0.01", CTX="4096"):
        for mode, prompt in (("think", say(long_thought + "<</SAY>><<THEN>>The answer.<</THEN>>")),
                             ("harmony", "<|start|>user<|message|>q <<SAY>><|channel|>analysis<|message|>"
                              + "Thinking on and on. " * 20 + "<|end|><</SAY>><<THEN>>The answer.<|return|><</THEN>>"
                              "<|end|><|start|>assistant")):
            events = await collect(GenerationRequest(prompt=prompt, max_tokens=400, reasoning=mode, think_budget=12))
            done = final(events)
            assert done["kind"] == "done" and done["finish_reason"] == "stop", done
            assert text_of(events) == "The answer."
            thought = reasoning_of(events)
            assert thought and "never" not in thought and len(thought.encode()) <= 2 * 12
            assert 12 <= done["reasoning_tokens"] <= 13
            assert done["usage"]["completion_tokens"] >= 12 + len("The answer.") // 2
