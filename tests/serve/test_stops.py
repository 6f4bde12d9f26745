"""`stop` on text (serve/stops.py): pure functions, checked on hand-written and random text."""
from hypothesis import given, settings
from hypothesis import strategies as st

from autospec.serve.stops import StopStream, cut_at_stop, held_back


def test_the_earliest_match_of_any_stop_cuts():
    assert cut_at_stop("a = 1\nb = 2\n", ("\nb", "= 1")) == ("a ", True)
    assert cut_at_stop("abc", ("x",)) == ("abc", False)
    assert held_back("return x\n", ("\n\n", "def")) == 1
    assert held_back("x de", ("def",)) == 2 and held_back("x def", ("def",)) == 0


def test_a_stop_split_over_pieces_is_held_back_then_cut():
    stream = StopStream(("\n\n",))
    assert stream.feed("x = 1\n") == ("x = 1", False)  # the newline might start "\n\n"
    assert stream.feed("\ny = 2") == ("", True)


@settings(max_examples=300, deadline=None)
@given(text=st.text("ab\n", max_size=40), cuts=st.lists(st.integers(0, 40), max_size=8),
       stops=st.lists(st.text("ab\n", min_size=1, max_size=3), min_size=1, max_size=4))
def test_streamed_text_is_always_a_prefix_of_the_cut_whole(text, cuts, stops):
    stops = tuple(stops)
    want, hit = cut_at_stop(text, stops)
    stream, sent, bounds = StopStream(stops), "", sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    for a, b in zip(bounds, bounds[1:]):
        out, matched = stream.feed(text[a:b], final=b == len(text))
        sent += out
        assert want.startswith(sent)  # never a character the whole response would not have
        if matched:
            break
    assert sent == want
