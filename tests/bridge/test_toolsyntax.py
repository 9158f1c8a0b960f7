"""engine_bridge.toolsyntax: the prompt forms of tools, past calls and results per template, and the
incremental call parser (any split of the output into deltas gives the same text and calls as the
whole; what is not a call is text; a cut call is flagged and comes back as text)."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_bridge import prompting, toolsyntax as ts

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
           "required": ["city"]}
TOOLS = {"get_weather": WEATHER, "noop": {"type": "object", "properties": {}}}
IDS = lambda i: f"call_{i}"  # noqa: E731

# Minimal templates in the three families' shapes (not the vendors' files): what matters is
# which variables they read and how they print arguments.
HERMES = (
    "{% if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "</tools>\nCall with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}\n<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GLM = (
    "[gMASK]<sop>{% if tools %}<|system|>\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>"
    "</tool_call>{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|observation|><tool_response>"
    "{{ m.content }}</tool_response>{% else %}<|{{ m.role }}|>\n{{ m.content }}{% for c in m.tool_calls or [] %}"
    "<tool_call>{{ c.function.name }}\n{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v if v is string else v | tojson }}</arg_value>\n{% endfor %}</tool_call>{% endfor %}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"},
]
TOOL_LIST = [ts.Tool("get_weather", "Weather by city", WEATHER)]


def render(template, messages, **kw):
    msgs, extra = ts.prepare(messages, TOOL_LIST, ts.syntax_for(template))
    return prompting.render_prompt(msgs, template=template, bos_token="", eos_token="", extra=extra, **kw)


def test_the_syntax_is_sniffed_from_the_template():
    assert ts.syntax_for(HERMES) == "hermes"
    assert ts.syntax_for(GLM) == "glm45"
    assert ts.syntax_for(prompting.CHATML_TEMPLATE) == "generic"
    assert ts.syntax_for(None) == "generic"


def test_hermes_gets_tools_and_mapping_arguments_natively():
    prompt = render(HERMES, HISTORY)
    assert '"name": "get_weather"' in prompt and "<tools>" in prompt
    assert '"arguments": {"city": "Paris", "days": 2}' in prompt  # a mapping, not a double-encoded string
    assert "<tool_response>\nsunny\n</tool_response>" in prompt


def test_glm_iterates_the_arguments_mapping():
    prompt = render(GLM, HISTORY)
    assert "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>" in prompt
    assert "<arg_value>2</arg_value>" in prompt and "<|observation|>" in prompt


def test_generic_form_for_a_chatml_template_without_tools():
    prompt = render(prompting.CHATML_TEMPLATE, HISTORY)
    system = prompt.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n") and '"get_weather"' in system and "<tool_call>" in system
    # The past call in the form the note asks for (content null -> ""), the result as a user turn.
    assert ("<|im_start|>assistant\n" + ts.call_text("get_weather", {"city": "Paris", "days": 2})) in prompt
    assert '<|im_start|>user\n<tool_response>\n{"name": "get_weather", "content": "sunny"}' in prompt
    # The call form the note shows is what the parser reads back.
    p = ts.ToolCallParser(TOOLS, syntax="generic")
    p.feed(ts.call_text("get_weather", {"city": "Oslo"}))
    p.finish()
    assert [(c.name, json.loads(c.arguments)) for c in p.ok_calls] == [("get_weather", {"city": "Oslo"})]


def test_rendering_is_pure_and_keeps_the_prefix():
    for template in (HERMES, GLM, prompting.CHATML_TEMPLATE):
        whole = render(template, HISTORY)
        assert whole == render(template, HISTORY)
        assert whole.startswith(render(template, HISTORY[:2], add_generation_prompt=False))


def test_consecutive_generic_results_share_one_user_turn():
    two = HISTORY + [{"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "rain"}]
    msgs, _ = ts.prepare(two, TOOL_LIST, "generic")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[-1]["content"].count("<tool_response>") == 2


# --- the parser ---------------------------------------------------------------------------------

def run(text, cuts=(), **kw):
    """Feeds text split at `cuts`; -> (parser, events)."""
    kw.setdefault("syntax", "hermes")
    p = ts.ToolCallParser(TOOLS, new_id=IDS, **kw)
    events, last = [], 0
    for at in sorted(set(cuts)) + [len(text)]:
        events += p.feed(text[last:at])
        last = at
    events += p.finish()
    return p, events


def summary(p, events):
    text = "".join(e.text for e in events if isinstance(e, ts.Text))
    args = {}
    for e in events:
        if isinstance(e, ts.CallArgs):
            args[e.index] = args.get(e.index, "") + e.delta
    starts = [(e.index, e.name) for e in events if isinstance(e, ts.CallStart)]
    assert [i for i, _ in starts] == list(range(len(starts)))  # contiguous from 0, once each
    ends = [e for e in events if isinstance(e, ts.CallEnd)]
    assert [e.index for e in ends] == [i for i, _ in starts]
    assert text == p.text
    calls = [(c.name, c.arguments, c.ok) for c in p.calls]
    assert all(args.get(c.index, "") == c.arguments for c in p.calls)
    return text, calls, p.cut


words = st.text(alphabet="abc <>/{}\":,\n_", max_size=12)


def hermes_call(name, args):
    return ts.call_text(name, args)


def glm_call(name, args):
    pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                    for k, v in args.items())
    return f"<tool_call>{name}\n{pairs}</tool_call>"


arg_values = st.fixed_dictionaries({"city": st.text(alphabet="xyz é\"\\<>\n", max_size=8)},
                                   optional={"days": st.integers(-5, 500)})
segments = st.one_of(
    words.map(lambda w: ("text", w)),
    arg_values.map(lambda a: ("call", a)),
    st.just(("broken", '<tool_call>\n{"name": "get_weather", "arguments": {"city": x}}\n</tool_call>')),
    st.just(("unknown", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')),
)


def compose(segs, form):
    parts = []
    for kind, value in segs:
        parts.append(form("get_weather", value) if kind == "call" else value)
    return "\n".join(parts)


@settings(max_examples=300, deadline=None)
@given(segs=st.lists(segments, max_size=5), data=st.data())
def test_any_split_gives_the_same_text_and_calls(segs, data):
    text = compose(segs, hermes_call)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole = summary(*run(text))
    assert summary(*run(text, cuts)) == whole
    assert summary(*run(text, range(len(text)))) == whole  # one character per delta
    _, calls, _ = whole
    good = [v for kind, v in segs if kind == "call"]
    assert [json.loads(a) for _, a, ok in calls if ok] == good


@settings(max_examples=200, deadline=None)
@given(segs=st.lists(segments, max_size=4), data=st.data())
def test_glm_any_split_gives_the_same_text_and_calls(segs, data):
    text = compose(segs, glm_call)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    whole = summary(*run(text, syntax="glm45"))
    assert summary(*run(text, cuts, syntax="glm45")) == whole
    good = [v for kind, v in segs if kind == "call"]
    assert [json.loads(a) for _, a, ok in whole[1] if ok] == good


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab {}\"<>/_\n", max_size=40))
def test_text_without_a_call_is_never_dropped(text):
    p, events = run(text)
    if not p.calls:
        assert [c for c in p.text if not c.isspace()] == [c for c in text if not c.isspace()]


def test_events_appear_while_the_call_is_written():
    text = hermes_call("get_weather", {"city": "Paris", "days": 3})
    p = ts.ToolCallParser(TOOLS, syntax="hermes", new_id=IDS)
    seen = []
    for i, ch in enumerate(text):
        seen += [(i, e) for e in p.feed(ch)]
    start = next(i for i, e in seen if isinstance(e, ts.CallStart))
    first_args = next(i for i, e in seen if isinstance(e, ts.CallArgs))
    assert start < text.index('"Paris"') and first_args < text.index("3}")
    assert isinstance(seen[0][1], ts.CallStart) and seen[0][1].id == "call_0"


def test_only_a_possible_marker_prefix_is_held_back():
    p = ts.ToolCallParser(TOOLS, syntax="hermes")
    assert [e.text for e in p.feed("Hello <tool")] == ["Hello"]
    assert [e.text for e in p.feed("box> world")] == [" <toolbox> world"]


def test_a_call_cut_by_the_budget_is_text_and_flagged():
    text = hermes_call("get_weather", {"city": "Paris"})[:-20]
    p, events = run(text)
    assert p.cut and not p.ok_calls and p.text == text
    assert isinstance(events[-2], ts.CallEnd) and not events[-2].ok


def test_text_around_calls_is_kept():
    text = "Checking.\n" + hermes_call("get_weather", {"city": "A"}) + "\nDone."
    p, _ = run(text)
    assert p.text == "Checking.\nDone." and len(p.ok_calls) == 1


def test_arguments_before_the_name_or_as_a_string_still_parse():
    p, _ = run('<tool_call>{"arguments": {"city": "B"}, "name": "get_weather"}</tool_call>')
    assert [json.loads(c.arguments) for c in p.ok_calls] == [{"city": "B"}]
    p, _ = run('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"C\\"}"}</tool_call>')
    assert [json.loads(c.arguments) for c in p.ok_calls] == [{"city": "C"}]


def test_one_call_when_parallel_calls_are_off():
    text = hermes_call("get_weather", {"city": "A"}) + hermes_call("get_weather", {"city": "B"})
    p, _ = run(text, max_calls=1)
    assert len(p.calls) == 1 and "B" in p.text


def test_glm_string_values_stream_and_others_parse():
    p, events = run(glm_call("get_weather", {"city": 'Pa"ris\n', "days": 3}), range(200), syntax="glm45")
    assert json.loads(p.ok_calls[0].arguments) == {"city": 'Pa"ris\n', "days": 3}
    assert sum(isinstance(e, ts.CallArgs) for e in events) > 5  # the string went out piece by piece


@settings(max_examples=150, deadline=None)
@given(args=arg_values, parallel=st.booleans(), data=st.data())
def test_constrained_forms_parse_under_any_split(args, parallel, data):
    named = json.dumps(args)
    required = json.dumps([{"name": "get_weather", "arguments": args}] * (2 if parallel else 1))
    for mode, text in (("args", named), ("calls", required)):
        cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
        p, events = run(text, cuts, mode=mode, forced="get_weather")
        assert summary(p, events) == summary(*run(text, mode=mode, forced="get_weather"))
        n = len(json.loads(text)) if mode == "calls" else 1
        assert [json.loads(c.arguments) for c in p.ok_calls] == [args] * n and p.text == ""
        q, _ = run(text[:len(text) // 2], mode=mode, forced="get_weather")
        assert q.cut and len(q.ok_calls) < n and all(json.loads(c.arguments) == args for c in q.ok_calls)
        assert q.text.strip() or q.ok_calls  # the open call came back as text, or the cut fell between calls


def test_forced_schemas():
    tools = [ts.Tool("a", parameters={"type": "object"}), ts.Tool("b", parameters={"type": "object", "required": ["x"]})]
    assert ts.forced_schema(tools, choice="b") == {"type": "object", "required": ["x"]}
    schema = ts.forced_schema(tools, choice="required", parallel=False)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [b["properties"]["name"] for b in schema["items"]["anyOf"]] == [{"enum": ["a"]}, {"enum": ["b"]}]


@given(text=st.text(max_size=30))
def test_the_json_scan_agrees_with_json_loads(text):
    scan = ts.JsonScan()
    try:
        for ch in text:
            scan.push(ch)
        scan.close()
        ok = True
    except ts.BadJson:
        ok = False
    try:
        json.loads(text, parse_constant=lambda c: 1 / 0)
        expected = bool(text.strip())
    except (ValueError, ZeroDivisionError):
        expected = False
    assert ok == expected
