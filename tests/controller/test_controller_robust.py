"""The controller does not lock a workload into plain decoding.

A copy-heavy request (every n-gram proposal right) whose first drafted forwards are slow — a
cold start, an allocation, a noisy neighbour — must still reach n-gram with K > 1 within a
bounded number of steps. Before the fix, those forwards fixed the verify line's slope and
K = 0 ran forever: plain steps never measure a slope, so nothing corrected it.
"""
import pytest
from rows import row

from autospec.controller.adaptive import AdaptiveController, ControllerSettings
from autospec.controller.cost import StepCost
from autospec.controller.interface import Outcome, Step, decide_one, observe_one
from autospec.telemetry import StepRecord

PERIOD = list(range(100, 140))  # a 40-token cycle: the prompt holds it twice, the output repeats it


def true_verify_seconds(k: int) -> float:
    return 0.010 + 0.0004 * k  # a memory-bound forward: nearly flat in K


def run(controller, steps: int = 600, slow_forwards: int = 3, slowdown: float = 20.0):
    """Drive `controller` over one long copy-heavy request; the first `slow_forwards` drafted
    forwards cost `slowdown` times their true price. Returns the (drafter, k) of each step."""
    request = row("r", PERIOD * 2, 2 * len(PERIOD), "copy-heavy")
    slow_left, chosen = slow_forwards, []
    for step in range(steps):
        drafter, k, _ = decide_one(controller, request)
        k = k if drafter else 0
        seconds = true_verify_seconds(k)
        if k and slow_left:
            seconds, slow_left = seconds * slowdown, slow_left - 1
        context = len(request.tokens) - 1
        # the target's output continues the cycle, so an n-gram draft of length k is all right
        emitted = [PERIOD[(len(request.tokens) + i) % len(PERIOD)] for i in range(k + 1)]
        request.tokens.extend(emitted)
        observe_one(controller, StepRecord("r", step, drafter or "none", k, k, k, k + 1,
                                     1e-5 * k, seconds, k + 1, context, 0, 0.0), request)
        chosen.append((drafter, k))
    return chosen


def settings(**knobs):
    return ControllerSettings(drafters=("ngram",), **knobs)  # the defaults: the fix is on


def test_slow_first_forwards_do_not_lock_in_plain_decoding():
    chosen = run(AdaptiveController(settings()))
    # locked in for a while (the slow forwards made drafting look dear), then out of it:
    # without the fix every one of the last 590 steps is plain (test below)
    assert sum(k == 0 for _, k in chosen) <= 200
    late = chosen[-100:]
    assert sum(d == "ngram" and k > 1 for d, k in late) >= 90, late[:10]


def test_the_premise_without_the_fix_it_locks_in():
    """The same run with the staleness widening switched off: plain decoding for good (this is
    the bug the test above guards against; if this stops failing to draft, the test above no
    longer tests anything)."""
    late = run(AdaptiveController(settings(cost_stale_steps=0)))[-100:]
    assert sum(k == 0 for _, k in late) >= 90


def test_step_cost_staleness():
    cost = StepCost(8, stale_after=10)
    for _ in range(2):
        cost.observe(1, 1, 0.01)
        cost.observe(1, 5, 0.5)  # slow: drafting is now dear
    steep = cost.prices(1)
    assert steep.step(4) > 10 * steep.step(0)
    for _ in range(10):
        cost.observe(1, 1, 0.01)
    now = cost.prices(1)
    assert now.step(4) > 5 * now.step(0)  # 10 plain: still trusted
    for _ in range(10):  # 20 plain forwards since the last drafted one: the slope has gone
        cost.observe(1, 1, 0.01)
    flat = cost.prices(1)
    assert flat.step(4) == pytest.approx(flat.step(0), rel=1e-9)
