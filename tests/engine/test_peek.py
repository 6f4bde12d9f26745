"""Look-up drafters' proposals seen before the decision (Engine.peek, into the step's
`looked`), and reused by that step.

The controller decides K for n-gram and suffix from their proposal (its length, the suffix
drafter's confidences): the step must then draft nothing twice, use exactly what was seen,
and never use a proposal looked up at another context.
"""
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.drafters.base import runnable_drafters
from autospec.engine.loop import Engine
from autospec.controller.interface import StaticController
from conftest import REPO_ROOT, assert_lossless

PROMPT = "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef f(x):\n"


def counting(engine: Engine, request, name: str) -> list[int]:
    """Wrap the request's drafter's propose; returns the list its calls are counted in."""
    drafter = engine.drafter_for(request, name)
    calls, propose = [], drafter.propose

    def counted(ctx, k):
        calls.append(k)
        return propose(ctx, k)
    drafter.propose = counted
    return calls


def test_a_peeked_proposal_is_the_steps_draft_and_is_not_drafted_again(tiny_engine):
    for name in ("ngram", "suffix"):
        request = tiny_engine.start(PROMPT, max_new_tokens=16)
        calls = counting(tiny_engine, request, name)
        looked = {}
        draft = tiny_engine.peek(looked, request, name, 8)
        assert draft is not None and calls == [8]
        tiny_engine.step_batch([(request, name, 4)], looked)
        assert calls == [8], name  # the step reused the look-up
        assert request.steps[-1].proposed == len(draft.tokens[:4])
        tiny_engine.finish(request)  # its row back to the shared engine


def test_a_stale_or_short_peek_is_not_used(tiny_engine):
    request = tiny_engine.start(PROMPT, max_new_tokens=16)
    calls = counting(tiny_engine, request, "ngram")
    looked = {}
    tiny_engine.peek(looked, request, "ngram", 2)
    tiny_engine.step_batch([(request, "ngram", 4)], looked)  # more than was looked up: anew
    assert calls == [2, 4]
    tiny_engine.peek(looked, request, "ngram", 8)
    tiny_engine.step_batch([(request, None, 0)], looked)  # a plain step: the look-up is stale
    tiny_engine.step_batch([(request, "ngram", 4)], looked)
    assert calls == [2, 4, 8, 4]
    tiny_engine.finish(request)


def test_model_drafters_are_not_peeked(tiny_engine):
    request = tiny_engine.start(PROMPT, max_new_tokens=16)
    assert tiny_engine.peek({}, request, "draft-model", 4) is None
    tiny_engine.finish(request)


def test_the_loop_hands_the_controller_its_look_ups_and_charges_them_as_drafting(tiny_engine):
    """advance: the controller decides from `peek`, the step reuses what it saw, and the look-
    up's seconds are the step's draft seconds, not the controller's."""
    request = tiny_engine.start(PROMPT, max_new_tokens=16)
    calls = counting(tiny_engine, request, "ngram")
    seen = []

    class Peeking(StaticController):
        def decide(self, step):
            seen.append(step.peek(step.rows[0], "ngram", 8))
            return [("ngram", 4)]

    tiny_engine.advance([(request, Peeking("ngram", 4))])
    record = request.steps[-1]
    assert calls == [8] and record.proposed == len(seen[0].tokens[:4])
    assert record.draft_seconds > 0 and record.overhead_seconds is not None
    tiny_engine.finish(request)


def test_the_controller_with_suffix_is_lossless(tiny_engine):
    plain = tiny_engine.generate(PROMPT, controller=StaticController(None, 0), max_new_tokens=48)
    controller = AdaptiveController(ControllerSettings(drafters=("ngram", "suffix", "draft-model")))
    for _ in range(3):  # later requests find the earlier outputs in the shared index
        out = tiny_engine.generate(PROMPT, controller=controller, max_new_tokens=48)
        assert_lossless(tiny_engine.models, PROMPT, plain.token_ids, out.token_ids)


def test_a_policy_listing_suffix_gets_it_in_bench_and_serve(reference_pair):
    """The drafters a controller binds to are every registered drafter the pair can run, not
    the built-in default list: a policy that opts into suffix must be able to choose it."""
    from autospec.controller.factory import make_controller
    from autospec.method import parse_method
    policy = REPO_ROOT / "policies" / "suffix.yaml"
    controller = make_controller(parse_method(f"adaptive:{policy}"))
    controller.bind(runnable_drafters(reference_pair))
    assert "suffix" in controller.drafters
    default = make_controller(parse_method("adaptive"))
    default.bind(runnable_drafters(reference_pair))
    assert "suffix" not in default.drafters
