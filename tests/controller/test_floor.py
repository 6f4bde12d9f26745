"""The floor (controller/floor.py): the controller never trails, for long, a fixed arm it can
score for free — and leaves a policy that does better alone.

Known by construction: a request whose output first copies its prompt (n-gram at K = 16 is the
best arm) and then turns to random digits (every n-gram draft is wrong: plain decoding is the
best arm), replayed under a policy handicapped to always draft one n-gram token.
"""

import numpy as np

from autospec.bench.trace import Trace, TraceRequest, replay
from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.drafters.ngram import ngram_match
from conftest import REPO_ROOT

TRACES = REPO_ROOT / "configs" / "traces"
K_MAX = 16
COPY, RANDOM = 300, 300  # output tokens of each phase


def two_phase_trace() -> Trace:
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 1100, 400).tolist()
    output = prompt[:COPY] + rng.integers(0, 10, RANDOM).tolist()
    tokens = np.array(prompt + output)
    match = []
    for t in range(len(output)):
        proposal = ngram_match(tokens[:len(prompt) + t], 1, 4, K_MAX)
        truth = output[t:t + len(proposal)]
        agree = next((i for i, (a, b) in enumerate(zip(proposal, truth)) if a != b),
                     min(len(proposal), len(truth)))
        match.append(agree)
    verify = [0.010 + 0.004 * k for k in range(K_MAX + 1)]  # K = 1 costs 1.4 plain steps
    return Trace(K_MAX, verify, {"ngram": 1e-6},
                 [TraceRequest("r", "two-phase", prompt, output, {"ngram": match})])


class OneTokenPolicy(AdaptiveController):
    """A policy that is wrong on purpose: one n-gram token every step. Records who chose."""

    def __post_init__(self):
        super().__post_init__()
        self.chosen = []  # (output position, (drafter, k), chosen by the floor?)

    def _own(self, state, request, *decision):
        self._by_policy = True
        return "ngram", 1

    def decide(self, request):
        self._by_policy = False
        choice = super().decide(request)
        self.chosen.append((len(request.tokens) - request.prompt_len, choice, not self._by_policy))
        return choice


def tokens_per_second(records) -> float:
    return sum(r.output_tokens for r in records) / sum(r.wall_seconds for r in records)


def test_the_floor_follows_the_best_arm_and_its_change_mid_request():
    trace = two_phase_trace()
    settings = ControllerSettings(drafters=("ngram",), k_max=K_MAX)
    with_floor = OneTokenPolicy(settings)
    records = replay(trace, with_floor)
    led = [(at, choice) for at, choice, floor in with_floor.chosen if floor and at]
    copy_phase = [choice for at, choice in led if 64 <= at < COPY]
    random_phase = [choice for at, choice in led if at >= COPY + 96]
    # copying: n-gram at the longest K; then plain decoding, found again within the request
    assert copy_phase and all(choice == ("ngram", K_MAX) for choice in copy_phase), copy_phase
    assert random_phase and all(choice == (None, 0) for choice in random_phase), random_phase
    # the policy still gets its probe windows
    assert any(not floor for at, _, floor in with_floor.chosen if at >= COPY + 96)

    without = OneTokenPolicy(ControllerSettings(drafters=("ngram",), k_max=K_MAX, floor=False))
    gain = tokens_per_second(records) / tokens_per_second(replay(trace, without))
    assert not any(floor for at, _, floor in without.chosen if at)  # step 0 measures plain
    # the best arm each phase would give 1.37x; every 4th window goes back to the policy
    assert gain > 1.1, gain


def test_the_floor_stays_out_where_the_policy_does_better():
    """On the shipped traces the adaptive policy beats every fixed n-gram K: the floor leads on
    few steps, and costs next to nothing."""
    for name in ("reference", "mixed"):
        trace = Trace.load(TRACES / f"{name}.json")
        floored = AdaptiveController(ControllerSettings(k_max=trace.k_max))
        records = replay(trace, floored)
        steps = sum(len(r.step_records) for r in records)
        assert floored.floor_steps <= 0.15 * steps, (name, floored.floor_steps, steps)
        free = tokens_per_second(replay(trace, AdaptiveController(
            ControllerSettings(k_max=trace.k_max, floor=False))))
        assert tokens_per_second(records) >= 0.95 * free, name
