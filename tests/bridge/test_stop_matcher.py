"""engine_bridge.stops: the linear stop matcher gives the former (quadratic) rule's answers on any
text, stop list and chunking (hypothesis), and stays linear on the lists that stalled the bridge."""
import time

from hypothesis import given, settings, strategies as st

from engine_bridge.stops import StopMatcher, naive_scan

ALPHABET = "abé\n"  # few letters: overlaps, repeats and prefixes are common


@settings(max_examples=400, deadline=None)
@given(stops=st.lists(st.text(ALPHABET, min_size=1, max_size=6), min_size=1, max_size=6),
       chunks=st.lists(st.text(ALPHABET, max_size=5), max_size=25))
def test_it_answers_as_the_naive_matcher(stops, chunks):
    m, text = StopMatcher(stops), ""
    for chunk in chunks:
        fed = len(text)
        text += chunk
        hit = m.feed(chunk)
        want_hit, want_held = naive_scan(text, fed, stops)
        assert hit == want_hit, (stops, chunks, text)
        if hit:
            break
        assert m.held == want_held, (stops, text)


def test_it_is_linear_on_the_lists_that_stalled_the_bridge():
    stops = ["a" * 255 + "b"] + ["a" * k + "c" for k in range(1, 32)]  # every prefix matches a run of a's
    m = StopMatcher(stops)
    t = time.perf_counter()
    for _ in range(5000):
        assert m.feed("aaaa") is None
    elapsed = time.perf_counter() - t
    assert m.held == 255
    assert elapsed < 0.5, f"20,000 characters took {elapsed:.3f} s"  # the naive rule: minutes
    t = time.perf_counter()
    StopMatcher(["ab" * 128] * 32)
    assert time.perf_counter() - t < 0.5
