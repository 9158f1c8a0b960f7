"""engine_bridge.routing.route, a pure function, over generated registry snapshots (hypothesis):
the model filter, conversation and prefix affinity, the imbalance guard, power of two choices and
the queue bound that stays global; and engine_bridge.registry's prefix chains, which the route's
prefix matching rests on."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine_bridge import registry, routing
from engine_bridge.registry import BridgeInfo, SlotHeld

MODELS = ("small", "big")
TEXT = st.text(alphabet="abcdefgh é\n", min_size=0, max_size=2000)


@st.composite
def bridge(draw: st.DrawFn, index: int) -> BridgeInfo:
    slots = draw(st.integers(1, 4))
    conversations = draw(st.lists(st.sampled_from(["c1", "c2", "c3", None]), min_size=slots, max_size=slots))
    texts = draw(st.lists(st.sampled_from(["", "A" * 600, "A" * 1200 + "B" * 300, "C" * 800]),
                          min_size=slots, max_size=slots))
    return BridgeInfo(
        id=f"b{index}", host=f"h{index}", boot=f"boot{index}", model=draw(st.sampled_from(MODELS)), fingerprint="",
        context=2048, slots=slots, busy=draw(st.integers(0, slots)), queued=draw(st.integers(0, 4)), beat_age_s=0.1,
        status=draw(st.sampled_from(["up", "up", "up", "starting"])), queue_limit=4,
        held=tuple(SlotHeld(c, registry.prefix_chain(t)) for c, t in zip(conversations, texts)))


@st.composite
def snapshot(draw: st.DrawFn) -> list[BridgeInfo]:
    return [draw(bridge(i)) for i in range(draw(st.integers(0, 5)))]


REQUEST = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS), "conversation_key": st.sampled_from(["c1", "c2", "c9", None]),
    "prompt": st.sampled_from(["", "A" * 700, "A" * 1300, "C" * 900, "Z" * 900]), "seed": st.integers(0, 2**16)})


def _route(bridges: list[BridgeInfo], request: dict) -> routing.Route | None:
    return routing.route(bridges, request["model"], conversation_key=request["conversation_key"],
                         prompt_chain=registry.prefix_chain(request["prompt"]), rng=random.Random(request["seed"]))


@settings(max_examples=400, deadline=None)
@given(snapshot(), REQUEST)
def test_a_route_goes_to_a_candidate_serving_the_model_and_none_only_when_nobody_serves_it(bridges, request):
    chosen = _route(bridges, request)
    pool = routing.candidates(bridges, request["model"])
    assert (chosen is None) == (not any(b.model == request["model"] for b in bridges))
    if chosen is not None:
        assert chosen.bridge in pool and chosen.bridge.model == request["model"]
        # an engine that is up and a queue with room win over the others whenever there is one
        assert chosen.bridge.status == "up" or not any(b.status == "up" for b in bridges if b.model == request["model"])
        assert not chosen.bridge.full or all(b.full for b in pool)


@settings(max_examples=400, deadline=None)
@given(snapshot(), REQUEST)
def test_affinity_never_costs_more_than_the_margin_over_the_least_loaded(bridges, request):
    """The imbalance guard: whatever a bridge holds, it is chosen for it only within the margin."""
    chosen = _route(bridges, request)
    if chosen is not None and chosen.reason in ("conversation", "prefix"):
        least = min(b.load for b in routing.candidates(bridges, request["model"]))
        assert chosen.bridge.load <= least + routing.IMBALANCE_MARGIN


@settings(max_examples=400, deadline=None)
@given(snapshot(), REQUEST)
def test_the_conversations_bridge_wins_while_within_the_margin(bridges, request):
    pool = routing.candidates(bridges, request["model"])
    key = request["conversation_key"]
    holders = [b for b in pool if any(h.conversation == key for h in b.held)]
    chosen = _route(bridges, request)
    if len(pool) > 1 and key is not None and holders:
        least = min(b.load for b in pool)
        if any(b.load <= least + routing.IMBALANCE_MARGIN for b in holders):
            assert chosen is not None and chosen.bridge in holders and chosen.reason == "conversation"


@settings(max_examples=300, deadline=None)
@given(snapshot(), REQUEST)
def test_load_choices_never_take_the_unique_most_loaded_and_are_reproducible(bridges, request):
    chosen = _route(bridges, request)
    assert chosen == _route(bridges, request)  # the same seed, the same choice
    pool = routing.candidates(bridges, request["model"])
    if chosen is not None and chosen.reason == "load":
        loads = sorted(b.load for b in pool)
        assert chosen.bridge.load < loads[-1] or loads[-1] == loads[-2]


def _bridge(name: str, *, busy: int = 0, held: tuple = (), slots: int = 2) -> BridgeInfo:
    return BridgeInfo(id=name, host=name, boot=name, model="m", fingerprint="", context=2048, slots=slots, busy=busy,
                      queued=0, beat_age_s=0.1, queue_limit=4, held=held)


def test_the_longest_prefix_over_the_threshold_wins_and_a_short_one_does_not():
    story = "Once upon a time " * 100  # 1,700 characters: six whole blocks
    a = _bridge("a", held=(SlotHeld(None, registry.prefix_chain(story[:600])),))
    b = _bridge("b", held=(SlotHeld(None, registry.prefix_chain(story)),))
    c = _bridge("c", held=(SlotHeld(None, registry.prefix_chain(story[:300])),))
    chain = registry.prefix_chain(story + " and then")
    chosen = routing.route([a, b, c], "m", prompt_chain=chain, rng=random.Random(1))
    assert chosen is not None and (chosen.bridge.id, chosen.reason, chosen.shared_blocks) == ("b", "prefix", 6)
    short = routing.route([a, c], "m", prompt_chain=registry.prefix_chain(story[:400]), rng=random.Random(1))
    assert short is not None and short.reason == "load"  # one shared block is under MIN_PREFIX_BLOCKS


def test_a_full_affine_bridge_loses_the_conversation_to_an_idle_one():
    held = (SlotHeld("conv:1", ""),)
    chosen = routing.route([_bridge("a", busy=2, held=held), _bridge("b")], "m", conversation_key="conv:1",
                           rng=random.Random(0))
    assert chosen is not None and (chosen.bridge.id, chosen.reason) == ("b", "load")
    kept = routing.route([_bridge("a", busy=1, held=held), _bridge("b")], "m", conversation_key="conv:1",
                         rng=random.Random(0))
    assert kept is not None and (kept.bridge.id, kept.reason) == ("a", "conversation")


@settings(max_examples=200, deadline=None)
@given(TEXT, TEXT, TEXT)
def test_prefix_chains_share_exactly_the_whole_blocks_the_texts_share(base, tail_a, tail_b):
    a, b = base + tail_a, base + tail_b
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    expected = min(common, len(a), len(b)) // registry.PREFIX_BLOCK_CHARS
    assert registry.shared_blocks(registry.prefix_chain(a), registry.prefix_chain(b)) == expected
