"""The suffix drafter: its index against the brute-force definition, eviction, losslessness,
cross-request sharing (on a target whose output is provably a cycle), privacy (sharing off,
tenants) and option errors. Its sampling exactness is in tests/engine/test_sampling.py."""
import gc
import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autospec.drafters.base import DraftContext, Verified, create_drafter
from autospec.drafters.suffix import SharedSuffixIndex, SuffixDraft, shared_index
from autospec.drafters.suffix_index import SuffixIndex, suffix_propose
from autospec.engine.loop import Engine
from autospec.models.pair import ModelPair
from autospec.models.sampling import SamplingParams
from conftest import (KS, REPO_ROOT, IdTokenizer, assert_lossless, counting_llama,
                      plain_and_speculative)

AGENTIC = REPO_ROOT / "configs" / "workloads" / "agentic.jsonl"

# small alphabets and depths, so that matches, ties, leaves and splits all happen
tokens_of = st.lists(st.integers(0, 3), max_size=24)
depths = st.sampled_from([2, 3, 4, 6, 8])
confidences = st.sampled_from([0.0, 0.1, 0.4, 0.6, 1.0])


def evicted(segments: list[list[int]], budget: int) -> list[list[int]]:
    """The segments once the oldest tokens beyond `budget` are gone (FIFO)."""
    drop, kept = max(0, sum(map(len, segments)) - budget), []
    for seg in segments:
        kept.append(seg[min(drop, len(seg)):])
        drop = max(0, drop - len(seg))
    return kept


# -- the index against the definition --------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(rounds=st.lists(st.tuples(st.lists(tokens_of, max_size=3), st.integers(0, 40)),
                       min_size=1, max_size=4),
       context=st.lists(st.integers(0, 3), min_size=1, max_size=12), k=st.integers(1, 8),
       depth=depths, min_confidence=confidences, hint=st.integers(0, 8))
def test_shared_index_equals_definition(rounds, context, k, depth, min_confidence, hint):
    """Segments added and evicted in rounds: every proposal is the brute-force one, over the
    tokens the budget keeps."""
    index, kept = SuffixIndex(depth), []
    for segments, budget in rounds:
        for seg in segments:
            index.extend(seg)
            index.close()
        index.evict(budget)
        kept = evicted(kept + segments, budget)
        assert index.live == sum(map(len, kept)) <= budget
        assert (index.propose(context, k, min_confidence, hint)
                == suffix_propose(kept, context, k, depth, min_confidence))


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=8),
       k=st.integers(1, 8), depth=depths, min_confidence=confidences)
def test_request_index_equals_definition_as_it_grows(pieces, k, depth, min_confidence):
    """A request's own index (one open segment), proposing after every append, through the
    drafter (sharing off) and the index itself."""
    drafter = create_drafter("suffix", None, share=False, depth=depth,
                             min_confidence=min_confidence)
    context: list[int] = []
    for piece in pieces:
        context += piece
        expected = suffix_propose([context], context, k, depth, min_confidence)
        draft = drafter.propose(DraftContext(list(context), SamplingParams()), k)
        assert (draft.tokens, draft.confidences, draft.match_length) == expected
        assert not draft.shared


def test_definition_on_a_hand_written_stream():
    # after [1, 2]: 3 twice (latest at 5), 4 once -> 3 with 2/3; after [1, 2, 3]: 5 and 6
    # once each, the latest (6) wins with 1/2
    segments = [[1, 2, 3, 5, 1, 2, 4, 0, 1, 2, 3, 6]]
    assert suffix_propose(segments, [9, 1, 2], 4, 8, 0.1) == ([3, 6], [2 / 3, 0.5], 2)
    assert suffix_propose(segments, [9, 1, 2], 4, 8, 0.6) == ([3], [2 / 3], 2)
    assert suffix_propose(segments, [7], 4, 8, 0.1) == ([], [], 0)
    index = SuffixIndex(8)
    index.extend(segments[0])
    assert index.propose([9, 1, 2], 4, 0.1) == ([3, 6], [2 / 3, 0.5], 2)


# -- eviction --------------------------------------------------------------------------------
def test_eviction_keeps_the_budget_and_frees_every_node():
    shared = SharedSuffixIndex(depth=8, budget_tokens=100)
    for i in range(400):
        shared.add([(i * 7 + j) % 11 for j in range(23)])
        assert len(shared) <= 100
    assert shared.index.live == 100
    assert len(shared.index.tokens) < 400 * 24 // 2  # the stream's dead head is trimmed, too
    shared.set_budget(0)
    root = shared.index.root
    assert len(shared) == 0 and root.count == root.cont == 0
    assert root.children is None and root.only is None  # nothing left behind


def test_eviction_stops_at_the_open_segment():
    index = SuffixIndex(4)
    index.extend([1, 2, 3])
    with pytest.raises(RuntimeError, match="close"):
        index.evict(0)


# -- the agentic workload -------------------------------------------------------------------
def test_agentic_workload_is_the_builders_output():
    """24 rows, 8 per category, interleaved, built from click, optuna and SQLAlchemy: the
    shipped file is what `python -m autospec.bench.agentic` writes (with the versions it was
    built from; others may differ, and then only the shape is checked)."""
    from importlib.metadata import version
    from autospec.bench.agentic import VERSIONS_NOTE, agentic_rows
    from autospec.bench.prompts import load_prompts
    prompts = load_prompts(AGENTIC)
    assert [p.category for p in prompts[:3]] == ["tool-call", "test", "docstring"]
    assert Counter(p.category for p in prompts) == {"tool-call": 8, "test": 8, "docstring": 8}
    assert len({p.id for p in prompts}) == 24
    installed = f"click {version('click')}, optuna {version('optuna')}, SQLAlchemy {version('sqlalchemy')}"
    if installed == VERSIONS_NOTE:
        assert [json.loads(line) for line in AGENTIC.read_text().splitlines()] == agentic_rows()


# -- losslessness ----------------------------------------------------------------------------
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 383), min_size=1, max_size=40), k=st.sampled_from(KS))
def test_greedy_identical_on_random_prompts(tiny_engine, prompt, k):
    plain, spec = plain_and_speculative(tiny_engine, prompt, "suffix", k)
    assert_lossless(tiny_engine.models, prompt, plain.token_ids, spec.token_ids)


@pytest.mark.parametrize("k", KS)
def test_greedy_identical_on_agentic_prompts(tiny_engine, k):
    rows = [json.loads(line) for line in AGENTIC.read_text().splitlines()]
    for row in rows[:6]:  # every category, one after the other: the shared index fills
        plain, spec = plain_and_speculative(tiny_engine, row["prompt"], "suffix", k, n=40)
        print(row["id"], k)
        assert_lossless(tiny_engine.models, row["prompt"], plain.token_ids, spec.token_ids)


VOCAB = 12


def counting_engine(**suffix_options) -> Engine:
    """The counting target: greedy output is (last token + 1) % 12, forever (conftest.py)."""
    return Engine(ModelPair(counting_llama(VOCAB), IdTokenizer()),
                  drafter_options={"suffix": suffix_options})


def run_twice(engine: Engine, k: int):
    """A long first request, then a short one with no token twice in prompt + output: its own
    index can never match, so whatever of it is accepted came from the first request."""
    first_plain, first = plain_and_speculative(engine, [0], "suffix", k, n=30)
    # generate() has returned: the request and its drafter are gone, the output handed over
    second_plain, second = plain_and_speculative(engine, [5], "suffix", k, n=10)
    assert first.token_ids == first_plain.token_ids == [(1 + i) % VOCAB for i in range(30)]
    assert second.token_ids == second_plain.token_ids == [(6 + i) % VOCAB for i in range(10)]
    assert len(set([5] + second.token_ids)) == 11  # the premise: nothing to match in itself
    return first, second


@pytest.mark.parametrize("k", KS)
def test_second_request_drafts_from_the_first(k):
    first, second = run_twice(counting_engine(), k)
    assert first.telemetry.accepted > 0  # the cycle repeats inside the first request too
    # every proposal of the second request was right, and there were proposals
    assert second.telemetry.proposed > 0
    assert second.telemetry.accepted == second.telemetry.proposed
    assert second.telemetry.steps < 10  # fewer target forwards than tokens


def test_sharing_off_second_request_depends_on_itself_only():
    _, second = run_twice(counting_engine(share=False), 4)
    assert second.telemetry.proposed == 0  # nothing in itself to match, nothing shared
    # and a drafter with sharing off proposes the same whatever other requests ran before
    pair = ModelPair(counting_llama(VOCAB), IdTokenizer())
    fresh = create_drafter("suffix", pair, share=False)
    context = DraftContext([5, 6, 7, 5, 6], SamplingParams(), prompt_len=3)
    before = fresh.propose(context, 4)
    shared_index(pair).add(list(range(VOCAB)) * 3)
    assert create_drafter("suffix", pair, share=False).propose(context, 4) == before
    assert create_drafter("suffix", pair).propose(context, 4) != before  # the shared one helps


def test_tenants_never_see_each_other():
    pair = ModelPair(counting_llama(VOCAB), IdTokenizer())
    context = DraftContext([5], SamplingParams(), prompt_len=1)
    shared_index(pair, tenant="a").add(list(range(VOCAB)) * 2)
    assert create_drafter("suffix", pair, tenant="a").propose(context, 3).tokens == [6, 7, 8]
    assert create_drafter("suffix", pair, tenant="b").propose(context, 3).tokens == []
    assert create_drafter("suffix", pair).propose(context, 3).tokens == []
    other_pair = ModelPair(counting_llama(VOCAB), IdTokenizer())  # same name, another pair
    assert create_drafter("suffix", other_pair, tenant="a").propose(context, 3).tokens == []


def test_output_is_handed_over_at_eos_and_once():
    class Pair:  # what the drafter reads of a ModelPair
        eos_ids = {99}
    pair = Pair()
    drafter = create_drafter("suffix", pair, depth=4)
    draft = drafter.propose(DraftContext([0, 1, 2, 3], SamplingParams(), prompt_len=4), 2)
    assert isinstance(draft, SuffixDraft) and draft.tokens == []
    drafter.observe(Verified(0, 0, [4, 5]))
    assert len(shared_index(pair, depth=4)) == 0  # not finished: nothing shared yet
    drafter.observe(Verified(0, 0, [6, 99]))
    # the prompt's last depth - 1 tokens lead into the output: [1, 2, 3] + [4, 5, 6, 99]
    assert shared_index(pair, depth=4).index.tokens[:7] == [1, 2, 3, 4, 5, 6, 99]
    drafter.reset()
    del drafter
    gc.collect()
    assert len(shared_index(pair, depth=4)) == 7  # handed over once


def test_engine_finish_hands_over_once_without_eos():
    """The counting target never emits EOS: the request ends at max_new_tokens, and
    Engine.finish (the drafters' finish hook) hands its output over — while the request and
    its drafter are still alive, so no finalizer did it — and only once."""
    engine = counting_engine(depth=4)
    shared = shared_index(engine.models, depth=4)
    request = engine.start([0, 1], max_new_tokens=6)
    while not request.done:
        engine.step(request, "suffix", 3)
    assert len(shared) == 0  # running: nothing shared yet
    engine.finish(request)
    segment = [0, 1, 2, 3, 4, 5, 6, 7]  # the prompt's last depth - 1 tokens (all 2) + 6 out
    assert shared.index.tokens[:-1] == segment and len(shared) == len(segment)
    engine.finish(request)
    request.drafters["suffix"].reset()
    del request
    gc.collect()
    assert len(shared) == len(segment)  # once


# -- configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    ({"budget_tokens": -1}, "budget_tokens: expected an integer >= 0, got -1"),
    ({"min_confidence": 1.5}, r"min_confidence: expected a number in \[0, 1\], got 1.5"),
    ({"min_confidence": -0.1}, r"min_confidence: expected a number in \[0, 1\], got -0.1"),
    ({"budget": 10}, "suffix.budget: unknown field .did you mean 'budget_tokens'"),
    ({"depth": 1}, "depth: expected an integer in \\[2, 1024\\], got 1"),
    ({"share": "no"}, "share: expected true or false, got 'no'"),
    ({"tenant": ""}, "tenant: expected a non-empty string"),
])
def test_bad_options_name_the_value_and_what_is_accepted(options, message):
    with pytest.raises(ValueError, match=message):
        create_drafter("suffix", None, **options)
    with pytest.raises(ValueError, match=message):
        Engine(ModelPair(counting_llama(VOCAB), IdTokenizer()),
               drafter_options={"suffix": options}).generate([0], drafter="suffix", k=2,
                                                             max_new_tokens=4)
