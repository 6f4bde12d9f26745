"""Roll-back, stop conditions, telemetry sums, and the per-request drafter state."""
import pytest
import torch

from autospec.drafters.base import create_drafter
from autospec.engine.loop import Engine
from autospec.controller.interface import StaticController
from conftest import assert_lossless


def test_rollback_keeps_cache_at_context_length(tiny_engine):
    request = tiny_engine.start("def f(x):\n    return x\n" * 3, max_new_tokens=30)
    while not request.done:
        tiny_engine.step(request, "draft-model", 4)
        # the target's row holds every token but the newest, whatever was rejected
        assert tiny_engine.cache.lengths[request.slot] == len(request.tokens) - 1
        # the draft model's row holds what it was fed (its stale tail cut at the next propose)
        drafting = tiny_engine.batch_drafting["draft-model"]
        assert drafting.cache.lengths[request.slot] == len(drafting.fed[request.slot])
    tiny_engine.finish(request)  # its row back to the shared engine


def test_max_new_tokens_is_exact(tiny_engine):
    for k in (1, 3, 8):
        out = tiny_engine.generate("import os\n", drafter="ngram", k=k, max_new_tokens=17)
        assert len(out.token_ids) == 17
        assert out.telemetry.finish_reason == "length"


def test_eos_stops_and_is_last(tiny_engine, tiny_pair):
    plain = tiny_engine.generate("class A:\n", drafter=None, max_new_tokens=20)
    stop_token = plain.token_ids[5]
    old = tiny_engine.eos_ids
    tiny_engine.eos_ids = {stop_token}
    try:
        for drafter in ("ngram", "draft-model"):
            out = tiny_engine.generate("class A:\n", drafter=drafter, k=4, max_new_tokens=20)
            want = plain.token_ids[:plain.token_ids.index(stop_token) + 1]
            # trained weights: the near-tie rule up to plain's stop; the stop token ends the
            # output wherever it comes (plain's place unless a near-tie moved it)
            assert_lossless(tiny_pair, "class A:\n", want, out.token_ids[:len(want)])
            stopped = stop_token in out.token_ids
            assert (out.token_ids.index(stop_token) == len(out.token_ids) - 1 if stopped
                    else len(out.token_ids) == 20)
            assert out.telemetry.finish_reason == ("stop" if stopped else "length")
    finally:
        tiny_engine.eos_ids = old


def test_telemetry_sums(tiny_engine):
    out = tiny_engine.generate("x = 1\ny = 2\nx = 1\ny =", drafter="draft-model", k=4,
                               max_new_tokens=40, workload="copy-heavy")
    t = out.telemetry
    assert t.output_tokens == len(out.token_ids) == sum(s.emitted for s in t.step_records)
    for s in t.step_records[:-1]:  # the last step may be cut by the stop
        assert s.emitted == s.accepted + 1
        assert s.verify_tokens == s.proposed + 1
        assert s.accepted <= s.proposed <= s.k
    assert t.accepted == sum(s.accepted for s in t.step_records)
    assert t.mean_accepted_length == pytest.approx(t.output_tokens / t.steps)
    assert t.workload == "copy-heavy"
    assert sum(t.drafter_shares.values()) == pytest.approx(1.0)
    assert t.bytes_moved > 0 and t.bandwidth_gbs > 0


def test_plain_steps_emit_one_token_each(tiny_engine):
    out = tiny_engine.generate("def", controller=StaticController(None, 0), max_new_tokens=9)
    assert [s.emitted for s in out.telemetry.step_records] == [1] * 9
    assert out.telemetry.proposed == 0 and out.telemetry.acceptance_rate == 0.0


def test_interleaved_requests_do_not_share_state(tiny_pair):
    tiny_engine = Engine(tiny_pair, max_batch=2)
    prompts = ["a = 1\n" * 4, "def g():\n    pass\n" * 3]
    alone = [tiny_engine.generate(p, drafter="draft-model", k=3, max_new_tokens=20).token_ids
             for p in prompts]
    requests = [tiny_engine.start(p, max_new_tokens=20) for p in prompts]
    while not all(r.done for r in requests):
        for r in requests:
            if not r.done:
                tiny_engine.step(r, "draft-model", 3)
    assert [r.output for r in requests] == alone


def test_synthetic_drafter_hits_its_alpha(tiny_pair):
    from autospec.drafters.base import DraftContext
    from autospec.models.sampling import SamplingParams
    drafter = create_drafter("synthetic", tiny_pair, alpha=0.0)
    draft = drafter.propose(DraftContext([1, 2, 3], SamplingParams()), 3)
    logits = tiny_pair.target(torch.tensor([[1, 2, 3]])).logits[0, -1]
    assert draft.tokens[0] != int(logits.argmax())
