"""engine_bridge.route_phases on event sequences the engine writes (1 MoE row x 4 experts, top-1):
what a leg's steps do not explain is its prefill, a dropped token keeps its predecessor's phase,
a thinking budget's continuation prefill is thinking, and an engine without steps gives no split."""
from engine_bridge import protocol as p
from engine_bridge.route_phases import ANSWER, THINKING, PhaseRouting


def step(expert):
    return p.RouteStep(1, 1, 4, 1, [expert])


def routes(*counts):
    return p.Routes(1, 1, 4, [[0, e, n] for e, n in enumerate(counts) if n])


def test_steps_split_a_turn_and_the_rest_is_the_prompt():
    r = PhaseRouting(reasoning=True)
    r.leg(steps=True)
    r.accept(3, 0)
    for phase, expert in ((THINKING, 1), (THINKING, 1), (ANSWER, 2)):
        r.token(phase)
        r.step(step(expert))
    r.token(ANSWER)  # the last token: never forwarded
    r.routes(routes(2, 3, 1, 0))  # prompt: expert 0 twice, expert 1 once
    assert r.summary() == {"rows": 1, "cols": 4, "counts": [[0, 0, 2], [0, 1, 3], [0, 2, 1]],
                           "phases": {"prompt": [[0, 0, 2], [0, 1, 1]], "thinking": [[0, 1, 2]], "answer": [[0, 2, 1]]},
                           "positions": {"prompt": 3, "thinking": 2, "answer": 1}}


def test_a_budget_continuation_and_dropped_tokens():
    r = PhaseRouting(reasoning=True)
    r.leg(steps=True)
    r.accept(2, 0)
    r.token(THINKING)
    r.step(step(3))
    r.token(None)  # the budget cut the leg: the engine's next token is still thinking
    r.step(step(3))
    r.token(None)
    r.routes(routes(1, 1, 0, 2))
    r.leg(steps=True)  # the continuation: its prefill (the close of the thinking) is thinking
    r.accept(6, 4)
    r.token(ANSWER)
    r.step(step(2))
    r.token(None)  # after a stop string: an answer token still
    r.step(step(2))
    r.token(None)
    r.routes(routes(0, 2, 2, 0))
    out = r.summary()
    assert out["counts"] == [[0, 0, 1], [0, 1, 3], [0, 2, 2], [0, 3, 2]]
    assert out["phases"] == {"prompt": [[0, 0, 1], [0, 1, 1]], "thinking": [[0, 1, 2], [0, 3, 2]], "answer": [[0, 2, 2]]}
    assert out["positions"] == {"prompt": 2, "thinking": 4, "answer": 2}


def test_no_steps_no_phases_and_a_plain_job_has_no_thinking():
    r = PhaseRouting(reasoning=False)
    r.leg(steps=False)
    r.accept(3, 0)
    r.token(ANSWER)
    r.routes(routes(1, 1, 1, 0))
    assert r.summary() == {"rows": 1, "cols": 4, "counts": [[0, 0, 1], [0, 1, 1], [0, 2, 1]]}
    plain = PhaseRouting(reasoning=False)
    plain.leg(steps=True)
    plain.accept(1, 0)
    plain.token(ANSWER)
    plain.step(step(0))
    plain.routes(routes(2))
    assert plain.summary()["phases"] == {"prompt": [[0, 0, 1]], "answer": [[0, 0, 1]]}
    assert PhaseRouting(reasoning=False).summary() is None  # no ROUTES line


def test_steps_that_do_not_fit_the_counts_give_no_phases():
    r = PhaseRouting(reasoning=False)
    r.leg(steps=True)
    r.accept(1, 0)
    r.token(ANSWER)
    r.step(step(3))
    r.routes(routes(1))  # the step's expert 3 is not in ROUTES
    out = r.summary()
    assert out == {"rows": 1, "cols": 4, "counts": [[0, 0, 1]]}
