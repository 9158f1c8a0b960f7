"""engine_bridge.reasoning: the `<think>` splitter and the harmony channel parser.

The property that matters for streaming: whatever the cut of the output into deltas (engine
tokens, UTF-8 reassembly, pacing), the reasoning and the answer come out the same. Hypothesis
draws outputs built from the formats' own markers (so markers land split at every offset) and
random cuts, and compares against the output fed whole."""
import json

from hypothesis import given, settings, strategies as st

from engine_bridge.reasoning import (HarmonyParser, ThinkSplitter, mode_for, split_all, splitter_for)
from engine_bridge.toolsyntax import ToolCallParser


def cuts(text: str, points: list[int]) -> list[str]:
    points = sorted({p % (len(text) + 1) for p in points})
    out, last = [], 0
    for p in points:
        out.append(text[last:p])
        last = p
    out.append(text[last:])
    return out


THINK_PIECES = st.sampled_from(["<think>", "</think>", "<", "</", "think>", "\n", "\n\n", " ", "a", "é", "🙂",
                                "<thi", "nk>", "ans", "</think", "x</think>y"])
HARMONY_PIECES = st.sampled_from(["<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary",
                                  " to=functions.f ", "<|constrain|>", "json", "<|message|>", "<|end|>",
                                  "<|return|>", "<|call|>", "<|", "|>", "<", "a", "é", " ", "{\"x\": 1}", "\n"])


@settings(max_examples=400, deadline=None)
@given(st.lists(THINK_PIECES, max_size=24), st.lists(st.integers(min_value=0, max_value=400), max_size=12),
       st.booleans())
def test_think_splitter_is_independent_of_the_cut(pieces, points, inside):
    text = "".join(pieces)
    whole = split_all(ThinkSplitter(inside=inside), [text])
    assert split_all(ThinkSplitter(inside=inside), cuts(text, points)) == whole
    assert split_all(ThinkSplitter(inside=inside), list(text)) == whole


def think_reference(text: str, inside: bool) -> list:
    """The split of a whole output, written plainly: thinking is what lies between the opening
    (or the prompt's) `<think>` and the first `</think>`, newlines around it dropped."""
    if not inside:
        if not text.lstrip().startswith("<think>"):
            return [("text", text)] if text else []
        text = text.lstrip()[len("<think>"):]
    thought, closed, answer = text.partition("</think>")
    out = [("reasoning", thought.strip("\n")), ("text", answer.lstrip("\n") if closed else "")]
    return [(k, t) for k, t in out if t]


@settings(max_examples=400, deadline=None)
@given(st.lists(THINK_PIECES, max_size=24), st.booleans())
def test_think_splitter_matches_the_plain_reference(pieces, inside):
    text = "".join(pieces)
    assert split_all(ThinkSplitter(inside=inside), list(text)) == think_reference(text, inside)


@settings(max_examples=400, deadline=None)
@given(st.lists(HARMONY_PIECES, max_size=28), st.lists(st.integers(min_value=0, max_value=400), max_size=12),
       st.sampled_from(["<|start|>assistant", "<|start|>assistant<|channel|>final<|message|>", "x"]))
def test_harmony_parser_is_independent_of_the_cut(pieces, points, prompt):
    text = "".join(pieces)
    whole = HarmonyParser.for_prompt(prompt)
    expected = split_all(whole, [text])
    for deltas in (cuts(text, points), list(text)):
        parser = HarmonyParser.for_prompt(prompt)
        assert split_all(parser, deltas) == expected
        assert parser.ended == whole.ended


def test_think_split_qwen3():
    out = "<think>\nThe user greets.\nReply briefly.\n</think>\n\nHello!"
    assert split_all(ThinkSplitter(), [out]) == [("reasoning", "The user greets.\nReply briefly."), ("text", "Hello!")]


def test_think_prompt_that_opens_thinking_starts_inside():
    splitter = ThinkSplitter.for_prompt("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert split_all(splitter, ["Hmm.\n</think>\n\nHi"]) == [("reasoning", "Hmm."), ("text", "Hi")]


def test_think_disabled_prompt_is_all_answer():
    prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert split_all(ThinkSplitter.for_prompt(prompt), ["Hi <think>x</think>"]) == [("text", "Hi <think>x</think>")]


def test_think_no_think_turn_writes_an_empty_block():
    assert split_all(ThinkSplitter(), ["<think>\n\n</think>\n\nShort."]) == [("text", "Short.")]


def test_think_cut_inside_thinking_is_reasoning():
    assert split_all(ThinkSplitter(), ["<think>\nstill going</thi"]) == [("reasoning", "still going</thi")]


def test_harmony_channels_and_end():
    parser = HarmonyParser.for_prompt("<|start|>user<|message|>hi<|end|><|start|>assistant")
    out = ("<|channel|>analysis<|message|>Greeting.<|end|><|start|>assistant<|channel|>final<|message|>"
           "Hello!<|return|>never")
    assert split_all(parser, [out]) == [("reasoning", "Greeting."), ("text", "Hello!")]
    assert parser.ended


def test_harmony_tool_call_becomes_the_hermes_form_the_tool_parser_reads():
    parser = HarmonyParser.for_prompt("<|start|>assistant")
    out = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>')
    segments = split_all(parser, list(out))
    assert parser.ended
    assert segments[0] == ("reasoning", "Need weather.")
    calls = ToolCallParser({"get_weather": {}}, syntax="hermes")
    for kind, text in segments[1:]:
        assert kind == "text"
        calls.feed(text)
    calls.finish()
    assert [(c.name, json.loads(c.arguments)) for c in calls.ok_calls] == [("get_weather", {"city": "Paris"})]
    assert calls.text == ""


def test_harmony_recipient_before_channel():
    parser = HarmonyParser.for_prompt("<|start|>assistant")
    out = '<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>'
    assert "".join(t for _, t in split_all(parser, [out[len("<|start|>assistant"):]])) == \
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


def test_harmony_prefilled_header_sends_the_body_as_text():
    parser = HarmonyParser.for_prompt("<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>")
    assert split_all(parser, ['{"a": 1}', "<|call|>"]) == [("text", '{"a": 1}')]


def test_harmony_plain_output_passes_through():
    parser = HarmonyParser.for_prompt("<|start|>assistant")
    assert split_all(parser, ["just words"]) == [("text", "just words")]
    long = "w" * 2000
    parser = HarmonyParser.for_prompt("<|start|>assistant")
    assert split_all(parser, [long]) == [("text", long)]
    assert parser.broken


def test_mode_for_templates():
    assert mode_for("{{ '<|start|>' }}<|channel|>") == "harmony"
    assert mode_for("<think>\n{{ x }}\n</think>") == "think"
    assert mode_for("<|im_start|>") is None
    assert splitter_for(None, "p") is None


BODY = st.text(alphabet=st.sampled_from(list("ab é🙂\n{}\"<|>")), max_size=12).filter(
    lambda t: not any(m in t for m in ("<|end|>", "<|return|>", "<|call|>", "<|message|>")))
MESSAGE = st.tuples(st.sampled_from(["analysis", "final", "commentary", "call"]), BODY)


@settings(max_examples=400, deadline=None)
@given(st.lists(MESSAGE, min_size=1, max_size=5), st.sampled_from(["<|return|>", "<|end|>", ""]),
       st.lists(st.integers(min_value=0, max_value=300), max_size=10))
def test_harmony_parser_matches_the_messages_it_was_written_from(messages, last_end, points):
    """Outputs written from a list of harmony messages: the parser gives back each message's body
    in its place (analysis -> reasoning; final / commentary -> answer; a call -> the hermes form),
    and nothing after the first <|return|> or <|call|>."""
    parts, expected = [], []
    for i, (channel, body) in enumerate(messages):
        start = "" if i == 0 else "<|start|>assistant"
        if channel == "call":
            parts.append(f"{start}<|channel|>commentary to=functions.f <|constrain|>json<|message|>{body}<|call|>")
            expected.append(("text", '<tool_call>\n{"name": "f", "arguments": ' + body + "}\n</tool_call>"))
            break
        end = last_end if i == len(messages) - 1 else "<|end|>"
        parts.append(f"{start}<|channel|>{channel}<|message|>{body}{end}")
        expected.append(("reasoning" if channel == "analysis" else "text", body))
        if end == "<|return|>":
            break
    merged = []
    for kind, text in expected:
        if text and merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        elif text:
            merged.append((kind, text))
    ended = parts[-1].endswith(("<|return|>", "<|call|>"))
    cut = not parts[-1].endswith(("<|return|>", "<|call|>", "<|end|>"))  # the output stops mid-message
    after = "" if cut else "<|start|>assistant<|channel|>final<|message|>after the end"
    parser = HarmonyParser.for_prompt("<|start|>user<|message|>q<|end|><|start|>assistant")
    got = split_all(parser, cuts("".join(parts) + after, points))
    if after and not ended:
        merged = merged[:-1] + [("text", merged[-1][1] + "after the end")] if merged and merged[-1][0] == "text" \
            else merged + [("text", "after the end")]
    assert got == merged
    assert parser.ended == ended


def test_harmony_end_token_not_written_closes_the_open_call():
    """Our engine ends the output at <|call|> / <|return|> (the file's end-of-generation tokens)
    without writing them: finish(end_token=True) ends the open body as the marker would; without
    it (a length cut) the call stays unclosed."""
    out = ('<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary '
           'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}')
    with_marker = split_all(HarmonyParser.for_prompt("<|start|>assistant"), [out + "<|call|>"])
    ended = HarmonyParser.for_prompt("<|start|>assistant")
    segments = ended.feed(out) + ended.finish(end_token=True)
    assert ended.ended and "".join(t for k, t in segments if k == "text") == "".join(
        t for k, t in with_marker if k == "text")
    cut = HarmonyParser.for_prompt("<|start|>assistant")
    text = "".join(t for k, t in cut.feed(out) + cut.finish() if k == "text")
    assert not cut.ended and not text.endswith("</tool_call>")
    answer = HarmonyParser.for_prompt("<|start|>assistant")
    final = "<|channel|>final<|message|>Hello!"
    assert answer.feed(final) + answer.finish(end_token=True) == [("text", "Hello!")] and answer.ended
