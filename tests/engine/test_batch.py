"""The batched step (Engine.step_batch): lossless under batching, rows join and leave, sampling
exact per request in a mixed batch, and bad input.

Batch composition changes float32 rounding, so an argmax may flip at a true near-tie. The
lossless checks tell that apart from a bug: a divergence from batch-1 plain decoding is
allowed only where plain's top-2 logit margin is below NEAR_TIE (printed when it happens).
"""
import itertools
import json

import numpy as np
import pytest
import torch

from autospec.drafters.base import runnable_drafters
from autospec.engine.loop import Engine

from autospec.engine.request import Job
from autospec.controller.interface import RowController, StaticController
from autospec.models.sampling import SamplingParams
from autospec.models.pair import ModelPair
from autospec.telemetry import StepRecord
from conftest import (NEAR_TIE, REPO_ROOT, IdTokenizer, assert_refused_only_at_near_ties,
                      divergences, random_llama)
from scipy_free_stats import chi2_pvalue

MIX = [(None, 0), ("ngram", 4), ("draft-model", 2)]  # row j drafts with MIX[j % 3]
WORKLOAD = REPO_ROOT / "configs" / "workloads" / "reference.jsonl"


class PerRow(RowController):
    """Each request keeps the (drafter, k) its job index picks: a mixed batch."""

    def __init__(self, mix):
        self.mix = mix

    def decide_row(self, request):
        return self.mix[int(request.request_id.split("-")[1]) % len(self.mix)]


def jobs(prompts, n):
    return [Job(p, n, request_id=f"job-{j}") for j, p in enumerate(prompts)]


def plain_outputs(pair, prompts, n):
    engine = Engine(pair)
    return [engine.generate(p, controller=StaticController(None, 0), max_new_tokens=n).token_ids
            for p in prompts]


def assert_near_ties_only(pair, prompts, got, plain):
    """Each output is plain's, or parts from it first at one of plain's near-ties."""
    for _, _, margin in divergences(pair, prompts, got, plain):
        assert margin < NEAR_TIE, f"diverged from plain at a top-2 margin of {margin:.2e}"


def test_mixed_batch_is_identical_to_plain_on_the_workload(reference_pair):
    """Every shipped workload prompt, rows of none / ngram:4 / draft-model:2 side by side,
    6 rows at a time (so rows join and leave mid-run): each output plain's (near-tie rule)."""
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()]
    plain = plain_outputs(reference_pair, prompts, 24)
    engine = Engine(reference_pair, max_batch=6, max_len=640)
    out = engine.run(jobs(prompts, 24), PerRow(MIX))
    assert_near_ties_only(reference_pair, prompts, [g.token_ids for g in out], plain)
    sizes = {s.batch_size for g in out for s in g.telemetry.step_records}
    assert max(sizes) == 6 and any(g.telemetry.proposed for g in out)
    assert sorted(engine.cache.free) == list(range(6))


@pytest.mark.parametrize("seed", [0, 1])
def test_random_prompts_diverge_only_at_near_ties(tiny_pair, seed):
    """Random token prompts of mixed lengths on the tiny pair, 4 rows of mixed drafters."""
    rng = np.random.default_rng(seed)
    vocab = tiny_pair.target.config.vocab_size
    prompts = [rng.integers(0, vocab, rng.integers(1, 40)).tolist() for _ in range(7)]
    plain = plain_outputs(tiny_pair, prompts, 20)
    out = Engine(tiny_pair, max_batch=4, max_len=128).run(jobs(prompts, 20), PerRow(MIX))
    assert_near_ties_only(tiny_pair, prompts, [g.token_ids for g in out], plain)


def test_a_draft_equal_to_the_target_is_always_accepted_in_a_batch(reference_pair):
    """The trained target drafts for itself: near-tie rule for the outputs, and a draft is
    refused only where its forward and the verify's round a near-tie apart."""
    pair = ModelPair(reference_pair.target, reference_pair.tokenizer, draft=reference_pair.target)
    prompts = ["def f(x):\n    return x\n", "import os\n", "class A:\n    pass\n"]
    plain = plain_outputs(pair, prompts, 16)
    mix = [("draft-model", 3), ("draft-model", 1), (None, 0)]
    out = Engine(pair, max_batch=3, max_len=128).run(jobs(prompts, 16), PerRow(mix))
    assert_near_ties_only(pair, prompts, [g.token_ids for g in out], plain)
    for prompt, g in zip(prompts[:2], out[:2]):
        assert g.telemetry.proposed > 0
        assert_refused_only_at_near_ties(pair, prompt, g)


def test_rows_join_and_leave_and_slots_are_reused(tiny_pair):
    """5 requests of different lengths through 2 rows: each starts as soon as a row frees,
    takes the freed slot, and still decodes as alone (near-tie rule: trained weights)."""
    prompts = ["def f(x):\n", "import os\n", "x = [1, 2, 3]\n", "class A:\n", "y = 2\n"]
    lengths = [4, 12, 6, 3, 8]
    engine = Engine(tiny_pair, max_batch=2, max_len=64)
    seen = {}  # request id -> slots it was in
    out = engine.run([Job(p, n, request_id=f"job-{j}") for j, (p, n) in enumerate(zip(prompts, lengths))],
                     PerRow(MIX), on_tokens=lambda r, t: seen.setdefault(r.request_id, set()).add(r.slot))
    plain = [Engine(tiny_pair).generate(p, drafter=None, max_new_tokens=n).token_ids
             for p, n in zip(prompts, lengths)]
    assert_near_ties_only(tiny_pair, prompts, [g.token_ids for g in out], plain)
    assert all(len(s) == 1 for s in seen.values())  # a row never moves
    assert {next(iter(s)) for s in seen.values()} == {0, 1}  # 5 requests, 2 slots: reused
    assert sorted(engine.cache.free) == [0, 1] and engine.cache.lengths == [0, 0]


def test_controller_sees_every_row_and_its_batch():
    """A controller is asked once per step with all its rows."""
    pair = ModelPair(random_llama(12, seed=0), IdTokenizer())
    calls = []

    class Batchwise(StaticController):
        def decide(self, step):
            calls.append(len(step.rows))
            return [(None, 0)] * len(step.rows)

    Engine(pair, max_batch=3, max_len=32).run(
        [Job([1, 2, 3], n) for n in (2, 5, 3, 4)], Batchwise(None, 0))
    assert calls[0] == 3 and max(calls) == 3 and calls[-1] == 1


def test_an_engine_binds_each_controller_once_before_its_first_step():
    """Controller.bind: told the engine's drafters once, before its first decision, however
    many steps, runs and generates follow; a second engine tells it again, and a new
    controller (even one at a freed one's address) is told on its own."""
    pair = ModelPair(random_llama(12, seed=0), IdTokenizer())
    events = []

    class Binding(StaticController):
        def bind(self, drafters):
            events.append(("bind", id(self), drafters))

        def decide(self, step):
            events.append(("decide", id(self)))
            return super().decide(step)

    engine = Engine(pair, max_batch=2, max_len=32)
    controller = Binding("ngram", 2)
    engine.run([Job([1, 2, 3, 1, 2], n) for n in (3, 5, 2)], controller)
    engine.generate([1, 2, 3], controller=controller, max_new_tokens=3)
    binds = [e for e in events if e[0] == "bind"]
    assert binds == [("bind", id(controller), runnable_drafters(pair))]
    assert events[0][0] == "bind" and len(events) > 4
    Engine(pair, max_len=32).generate([1, 2, 3], controller=controller, max_new_tokens=2)
    assert [e[0] for e in events].count("bind") == 2  # the second engine's
    for _ in range(3):  # new controllers, each told once
        events.clear()
        engine.generate([1, 2, 3], controller=Binding(None, 0), max_new_tokens=3)
        assert [e[0] for e in events] == ["bind", "decide", "decide", "decide"]


# -- sampling: exact per request, with the request in a batch of mixed drafters ------------
VOCAB, NEW = 3, 3
PROMPT = [0, 1, 2, 0, 1]
SAMPLES = 3000  # per row kind; the TV bound widens as 1/sqrt(n), as in test_sampling.py


@torch.no_grad()
def exact_distribution(target):
    probs = {}
    for seq in itertools.product(range(VOCAB), repeat=NEW):
        p = torch.softmax(target(torch.tensor([PROMPT + list(seq)])).logits[0].float(), -1)
        pos = len(PROMPT) - 1
        probs[seq] = float(np.prod([p[pos + i, seq[i]] for i in range(NEW)]))
    return probs


def test_sampling_is_exact_for_each_row_of_a_mixed_batch():
    target = random_llama(VOCAB, seed=0, scale=8.0, layers=1)
    draft = random_llama(VOCAB, seed=1, scale=8.0, layers=1)
    # 48 rows, a third of each kind, joining and leaving at their own steps
    engine = Engine(ModelPair(target, IdTokenizer(), draft), max_batch=48, max_len=16)
    mix = [("draft-model", 2), ("ngram", 2), (None, 0)]
    exact = exact_distribution(target)
    outcomes = list(exact)
    counts = np.zeros((len(mix), len(outcomes)))
    proposed = np.zeros(len(mix))
    batch = [Job(PROMPT, NEW, SamplingParams(1.0), seed=s, request_id=f"job-{s}")
             for s in range(len(mix) * SAMPLES)]
    for s, g in enumerate(engine.run(batch, PerRow(mix))):
        counts[s % len(mix), outcomes.index(tuple(g.token_ids))] += 1
        proposed[s % len(mix)] += g.telemetry.proposed
    assert proposed[0] > SAMPLES and proposed[1] > 0  # the drafting paths ran
    expected = np.array([exact[s] for s in outcomes])
    for j, (name, _) in enumerate(mix):
        tv = 0.5 * np.abs(counts[j] / SAMPLES - expected).sum()
        assert tv <= 0.01 * (100_000 / SAMPLES) ** 0.5, (name, tv)
        assert chi2_pvalue(counts[j], expected * SAMPLES) > 0.01, name


# -- bad input, telemetry --------------------------------------------------------------------
def test_bad_input_names_the_value(tiny_pair):
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        Engine(tiny_pair, max_batch=0)
    engine = Engine(tiny_pair, max_batch=2, max_len=32)
    with pytest.raises(ValueError, match=r"max_batch must be in 1\.\.2 .*got 0"):
        engine.run([Job("x = 1", 4)], max_batch=0)
    with pytest.raises(ValueError, match=r"request needs 40 positions \(prompt 30 \+ "
                                         r"max_new_tokens 10\); a row holds 32"):
        engine.start(list(range(30)), max_new_tokens=10)
    engine.start([1, 2], 4), engine.start([3, 4], 4)
    with pytest.raises(ValueError, match=r"the batch is full: all 2 rows"):
        engine.start([5, 6], 4)


def test_step_records_from_before_batching_still_parse():
    old = {"request_id": "r", "step": 0, "drafter": "ngram", "k": 4, "proposed": 4, "accepted": 2,
           "emitted": 3, "draft_seconds": 0.001, "verify_seconds": 0.01, "verify_tokens": 5,
           "context_tokens": 10, "bytes_moved": 100, "bandwidth_gbs": 1.0}
    record = StepRecord.from_dict(old)
    assert (record.batch_size, record.batch_tokens) == (1, 5)
    new = StepRecord.from_dict({**old, "batch_size": 4, "batch_tokens": 11})
    assert StepRecord.from_dict(new.to_dict()) == new
    with pytest.raises(ValueError, match="batch_tokens: expected a finite number"):
        StepRecord.from_dict({**old, "batch_tokens": "many"})


def test_a_job_that_cannot_start_ends_the_run_and_frees_the_rows(tiny_pair):
    engine = Engine(tiny_pair, max_batch=2, max_len=32)
    with pytest.raises(ValueError, match="request needs 50 positions"):
        engine.run([Job([1, 2], 20), Job([3, 4], 20), Job(list(range(40)), 10)])
    assert sorted(engine.cache.free) == [0, 1]


# -- the draft model drafts every row at once --------------------------------------------
def test_batched_drafts_equal_each_rows_own_drafter(reference_pair):
    """BatchDraftModel (one draft forward per position for all rows) proposes what each row's
    own DraftModelDrafter proposes alone, step after step — after partial accepts (a stale
    tail rolled back), full ones, and a first step that feeds a whole prompt. On the shipped
    pair (fixed weights, real code), not a model trained in the test session; the batch's
    forward rounds apart from a row's own, so the near-tie rule on the draft's margins."""
    from types import SimpleNamespace
    from autospec.drafters.base import DraftContext, create_drafter
    from autospec.drafters.draft_model import BatchDraftModel, DraftRow
    rng = np.random.default_rng(0)
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:3]]
    contexts = [reference_pair.tokenizer.encode(p)[-40:] for p in prompts]
    vocab = reference_pair.target.config.vocab_size
    alone = [create_drafter("draft-model", reference_pair) for _ in contexts]
    batched = BatchDraftModel(reference_pair.draft, max_batch=4, max_len=256)
    greedy = SamplingParams()
    for step in range(6):
        ks = [1 + (step + i) % 4 for i in range(len(contexts))]
        rows = [DraftRow(slot, DraftContext(list(c), greedy), k)
                for slot, (c, k) in enumerate(zip(contexts, ks))]
        drafts, _ = batched.propose(rows)
        for i, (c, k) in enumerate(zip(contexts, ks)):
            own = alone[i].propose(DraftContext(list(c), greedy), k).tokens
            for _, _, margin in divergences(SimpleNamespace(target=reference_pair.draft), [c],
                                            [drafts[i].tokens], [own]):
                assert margin < NEAR_TIE, f"draft diverged at a top-2 margin of {margin:.2e}"
            # the "target" keeps a prefix of the draft and adds a token of its own
            kept = int(rng.integers(0, k + 1))
            c += drafts[i].tokens[:kept] + [int(rng.integers(0, vocab))]
    assert batched.forwards == sum(max(1 + (s + i) % 4 for i in range(3)) for s in range(6))


def test_a_batch_of_draft_model_rows_runs_one_draft_forward_per_position(reference_pair):
    """Four rows on the draft model at k = 1, 2, 3, 3: each step runs 3 draft forwards (the
    deepest row's k), not 9, and every output is plain's."""
    prompts = ["def f(x):\n    return x\n", "import os\n", "class A:\n    pass\n", "x = [1, 2]\n"]
    plain = plain_outputs(reference_pair, prompts, 12)
    engine = Engine(reference_pair, max_batch=4, max_len=128)
    mix = [("draft-model", 1), ("draft-model", 2), ("draft-model", 3), ("draft-model", 3)]
    steps = []
    out = engine.run(jobs(prompts, 12), PerRow(mix),
                     on_tokens=lambda r, t: steps.append(engine.batch_drafting["draft-model"].forwards))
    assert_near_ties_only(reference_pair, prompts, [g.token_ids for g in out], plain)
    full = [s for g in out for s in g.telemetry.step_records if s.batch_size == 4]
    assert full and all(s.drafter == "draft-model" for s in full)
    # while all four rows run, a step adds at most 3 forwards (fewer near max_new_tokens)
    per_step = np.diff(sorted(set(steps)))
    assert per_step.max() <= 3


def test_rows_of_a_batched_drafting_are_charged_their_share_of_it(reference_pair):
    """A drafter that drafts all its rows in one forward per position charges each row its
    share, by the tokens it asked for: the rows' draft seconds add up to the drafting's (each
    row charged the whole priced a drafted token as if its row drafted alone)."""
    engine = Engine(reference_pair, max_batch=4, max_len=128)
    requests = [engine.start(p, max_new_tokens=32)
                for p in ["def f(x):\n", "import os\n", "class A:\n", "x = [1, 2]\n"]]
    ks = [1, 2, 3, 3]
    engine.step_batch([(r, "draft-model", k) for r, k in zip(requests, ks)])  # makes the drafting
    drafting = engine.batch_drafting["draft-model"]
    real = drafting.propose
    drafting.propose = lambda rows: (real(rows)[0], 9.0)  # the drafting's seconds, injected
    engine.step_batch([(r, "draft-model", k) for r, k in zip(requests, ks)])
    records = [r.steps[-1] for r in requests]
    assert [s.k for s in records] == ks
    # 9 s over 9 drafted tokens: 1 s a token each (+ each row's own propose, microseconds)
    assert [s.draft_seconds / k for s, k in zip(records, ks)] == pytest.approx([1.0] * 4, rel=0.01)


def test_rows_out_of_slot_order_and_with_gaps_read_the_cache_as_a_view(reference_pair):
    """step_batch feeds its rows in slot order, and a gap (a row that left, its slot free)
    gets a filler row, so every verify forward reads a view of the cache — no gather of every
    layer's K and V — and each row's output is still its plain decoding."""
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:4]]
    plain = plain_outputs(reference_pair, prompts, 24)
    engine = Engine(reference_pair, max_batch=4, max_len=1024)
    requests = [engine.start(p, 24) for p in prompts]
    engine.abandon(requests[1])  # slot 1 free: rows at slots 0, 2, 3
    firsts = []
    bind = engine.cache.bind

    def spy(slots, n_tokens, limit):
        out = bind(slots, n_tokens, limit)
        firsts.append(engine.cache.bound.first)
        return out

    engine.cache.bind = spy
    rows = [requests[3], requests[0], requests[2]]  # out of slot order
    while not all(r.done for r in rows):
        engine.step_batch([(r, "ngram", 4) for r in rows if not r.done])
    assert firsts and all(first is not None for first in firsts)
    assert_near_ties_only(reference_pair, [prompts[i] for i in (0, 2, 3)],
                          [requests[i].output for i in (0, 2, 3)], [plain[i] for i in (0, 2, 3)])


def test_a_few_rows_far_apart_are_gathered_not_filled(reference_pair):
    """Where free slots outnumber the rows between them (a run's last requests), the forward
    gathers the rows rather than computing a filler row per free slot (fails if the 2 rows
    at slots 0 and 4 ran as a 5-row forward), each row's output still its plain decoding."""
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:5]]
    plain = plain_outputs(reference_pair, [prompts[0], prompts[4]], 24)
    engine = Engine(reference_pair, max_batch=5, max_len=1024)
    requests = [engine.start(p, 24) for p in prompts]
    for i in (1, 2, 3):
        engine.abandon(requests[i])
    bound = []
    bind = engine.cache.bind

    def spy(slots, n_tokens, limit):
        out = bind(slots, n_tokens, limit)
        bound.append((engine.cache.bound.first, len(slots)))
        return out

    engine.cache.bind = spy
    rows = [requests[0], requests[4]]
    while not all(r.done for r in rows):
        engine.step_batch([(r, "ngram", 4) for r in rows if not r.done])
    assert (None, 2) in bound and all(n <= 2 for _, n in bound)
    assert_near_ties_only(reference_pair, [prompts[0], prompts[4]],
                          [requests[0].output, requests[4].output], plain)


def test_the_early_exit_drafts_its_rows_together_and_stays_lossless(tiny_pair):
    """The early exit batches its rows (Drafter.batch_drafting) as the draft model does: two
    early-exit rows beside a plain one, one drafting forward per position for both, each row
    still its plain decoding (near-tie rule: trained weights)."""
    prompts = ["def f(x):\n    return x\n" * 2, "import os\n", "x = 1\ny = 2\nx = 1\n"]
    plain = plain_outputs(tiny_pair, prompts, 16)
    engine = Engine(tiny_pair, max_batch=3, max_len=128)
    out = engine.run(jobs(prompts, 16), PerRow([("early-exit", 3), (None, 0), ("early-exit", 2)]))
    assert_near_ties_only(tiny_pair, prompts, [g.token_ids for g in out], plain)
    assert "early-exit" in engine.batch_drafting and engine.batch_drafting["early-exit"].forwards > 0
    assert any(s.drafter == "early-exit" and s.batch_size > 1
               for g in out for s in g.telemetry.step_records)


def test_logprobs_are_the_targets_in_a_batch_plain_or_speculative(reference_pair):
    """Each output token's logprob and its top alternatives, kept by the verify forward that
    emitted it, equal a plain forward's log_softmax over prompt + output (1e-4), whatever the
    row drafted and whoever shared its step; under greedy the token is its position's top."""
    import torch
    engine = Engine(reference_pair, max_batch=3)
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:3]]
    ctl = {0: StaticController(None, 0), 1: StaticController("ngram", 4),
           2: StaticController("draft-model", 3)}
    requests = [engine.start(p, 20, logprobs=2) for p in prompts]
    while not all(r.done for r in requests):
        live = [(r, ctl[i]) for i, r in enumerate(requests) if not r.done]
        engine.advance(live)
    for request in requests:
        generation = engine.finish(request)
        assert [e.token for e in generation.logprobs] == generation.token_ids
        ids = torch.tensor([request.tokens[:-1]])
        with torch.no_grad():
            want = torch.log_softmax(reference_pair.target(ids).logits[0].float(), -1)
        want = want[request.prompt_len - 1:]
        for entry, row in zip(generation.logprobs, want):
            assert abs(entry.logprob - float(row[entry.token])) < 1e-4
            top = row.topk(2)
            # the top 2 in order, but that two within rounding (a near-tie) may come swapped
            best = pytest.approx(top.values.tolist(), abs=1e-4)
            assert [float(row[t]) for t, _ in entry.top] == best
            assert [lp for _, lp in entry.top] == best
            assert entry.top[0][0] == entry.token
    with pytest.raises(ValueError, match="logprobs must be in 0..20"):
        engine.start("x", 4, logprobs=21)
    assert engine.generate("x", max_new_tokens=2).telemetry  # logprobs off: nothing kept


def test_chunked_prefill_interleaves_with_decoding_and_changes_no_token(reference_pair):
    """A long prompt joining a decoding row is prefilled 16 tokens a step: the other row emits
    on every step meanwhile, the joiner's first token comes once its prompt is in, and both
    outputs equal their own plain generation (a prompt alone prefills whole)."""
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:2]]
    plain = Engine(reference_pair)
    want = [plain.generate(p, drafter=None, max_new_tokens=24).token_ids for p in prompts]
    engine = Engine(reference_pair, max_batch=2, prefill_chunk=16)
    ngram = StaticController("ngram", 4)
    first = engine.start(prompts[0], 24)  # joining takes a row; advance prefills it
    assert engine.unfilled(first) == first.prompt_len - 1
    assert engine.advance([(first, ngram)])[0]  # no row decoding: all at once, then a step
    joiner = engine.start(prompts[1], 24)
    chunks = -(-(joiner.prompt_len - 1) // 16)
    for _ in range(chunks - 1):  # one chunk a step, in the forward of the other row's step
        emitted = engine.advance([(first, ngram), (joiner, ngram)])
        assert emitted[0] and not emitted[1]
    emitted = engine.advance([(first, ngram), (joiner, ngram)])  # its last chunk, then its
    assert emitted[0] and emitted[1] and engine.unfilled(joiner) == 0  # first token: 1 forward
    while not (first.done and joiner.done):
        engine.advance([(r, ngram) for r in (first, joiner) if not r.done])
    got = [engine.finish(r).token_ids for r in (first, joiner)]
    assert_near_ties_only(reference_pair, prompts, got, want)  # trained weights
    with pytest.raises(ValueError, match="prefill_chunk must be >= 1"):
        Engine(reference_pair, prefill_chunk=0)



def test_a_prompt_chunk_rides_in_the_forward_of_the_rows_between_which_it_sits(reference_pair):
    """A joining prompt in the middle slot, 40 tokens a step (wider than any verify row: it
    attends on its own) inside the forward of the two rows around it, which speculate: every
    output equals its own plain generation, and the rows' steps meanwhile computed the chunk."""
    prompts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()[:3]]
    plain = Engine(reference_pair)
    want = [plain.generate(p, drafter=None, max_new_tokens=24).token_ids for p in prompts]
    engine = Engine(reference_pair, max_batch=3, prefill_chunk=40)
    ngram = StaticController("ngram", 4)
    a, gone, c = (engine.start(p, 24) for p in prompts)
    engine.advance([(r, ngram) for r in (a, gone, c)])  # nobody decoding: all whole
    engine.abandon(gone)
    joiner = engine.start(prompts[1], 24)
    assert joiner.slot == 1 and engine.unfilled(joiner) > 40
    emitted = engine.advance([(a, ngram), (joiner, ngram), (c, ngram)])
    assert emitted[0] and not emitted[1] and emitted[2]
    assert a.steps[-1].batch_tokens >= 40 + 2  # the chunk and the two rows, one forward
    while not all(r.done for r in (a, joiner, c)):
        engine.advance([(r, ngram) for r in (a, joiner, c) if not r.done])
    got = [engine.finish(r).token_ids for r in (a, joiner, c)]
    assert_near_ties_only(reference_pair, prompts, got, want)  # trained weights
