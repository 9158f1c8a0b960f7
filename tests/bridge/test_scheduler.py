import pytest

from engine_bridge.scheduler import Job, QueueFull, Scheduler

LONG = "<|im_start|>system\nYou are a helpful assistant that answers briefly.<|im_end|>\n"


def run(s, req, prompt="hi", key=None, priority="interactive"):
    return [(j.req, slot) for j, slot in s.submit(Job(req, prompt, key, priority))]


def test_it_keeps_a_conversation_on_its_slot():
    s = Scheduler(2, 4)
    assert run(s, "a1", key="conv:1") == [("a1", 0)]
    assert run(s, "b1", key="conv:2") == [("b1", 1)]
    s.release("a1", "hi there")
    s.release("b1", "yo")
    assert run(s, "b2", key="conv:2") == [("b2", 1)]
    assert run(s, "a2", key="conv:1") == [("a2", 0)]


def test_it_waits_for_a_busy_conversation_slot_without_blocking_others():
    s = Scheduler(2, 4)
    run(s, "a1", key="conv:1")
    assert run(s, "a2", key="conv:1") == []
    assert run(s, "b1", key="conv:2") == [("b1", 1)]
    assert s.positions() == {"a2": 1}
    assert [(j.req, slot) for j, slot in s.release("a1")] == [("a2", 0)]


def test_it_picks_the_slot_with_the_longest_shared_prefix():
    s = Scheduler(3, 4)
    for req, text in (("x", "other text"), ("y", LONG + "question one"), ("z", "zzz")):
        run(s, req)
        s.release(req, text)
    assert run(s, "api", prompt=LONG + "question one, answer, question two") == [("api", 1)]


def test_it_ignores_a_short_shared_prefix_and_prefers_a_fresh_slot():
    s = Scheduler(2, 4)
    run(s, "x")
    s.release("x", "hello world")
    assert run(s, "api", prompt="hello there") == [("api", 1)]


def test_it_evicts_the_least_recently_used_idle_slot():
    s = Scheduler(2, 4)
    run(s, "a", key="conv:a")
    run(s, "b", key="conv:b")
    s.release("b", "b")
    s.release("a", "a")   # a used more recently than b
    assert run(s, "c", key="conv:c") == [("c", 1)]
    assert [sl.key for sl in s.slots] == ["conv:a", "conv:c"]
    s.release("c", "c")
    assert run(s, "b2", key="conv:b") == [("b2", 0)]  # conv:b was evicted: gets the LRU slot


def test_it_queues_fifo_with_interactive_first_and_reports_positions():
    s = Scheduler(1, 4)
    run(s, "running")
    run(s, "bg", priority="background")
    run(s, "i1")
    run(s, "i2")
    assert s.positions() == {"i1": 1, "i2": 2, "bg": 3}
    assert s.remove("i1")
    assert s.positions() == {"i2": 1, "bg": 2}
    assert [j.req for j, _ in s.release("running")] == ["i2"]
    assert s.positions() == {"bg": 1}


def test_it_rejects_when_the_queue_is_full():
    s = Scheduler(1, 2)
    run(s, "running")
    run(s, "q1")
    run(s, "q2")
    with pytest.raises(QueueFull):
        run(s, "q3")
    assert s.positions() == {"q1": 1, "q2": 2}


def test_it_never_starts_jobs_while_paused_and_resets_slots():
    s = Scheduler(1, 2)
    run(s, "a", key="conv:a")
    s.paused = True
    s.reset()
    assert run(s, "b") == []
    s.paused = False
    assert [(j.req, slot) for j, slot in s.dispatch()] == [("b", 0)]
    assert s.slots[0].key is None
