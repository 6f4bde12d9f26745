"""A floor under the controller: never trail, for long, a fixed choice it can score for free.

The adaptive policy decides from estimates, and estimates can be wrong (a slow start, a model
that misjudges bursts). Some fixed policies can be scored exactly on the tokens the target
emits, whatever the controller does: plain decoding (one token a forward) and prompt lookup
at a fixed K, replayed through the request on the controller's own n-gram index (which answers
for any earlier prefix): at its cursor the arm proposes what n-gram would have, accepts the
agreeing prefix of what the target emitted, and moves on. An arm's seconds are the cost
model's predictions for the forwards it would have run; the policy's own are measured.

The output is cut into windows of `WINDOW` tokens or `WINDOW_STEPS` steps, whichever ends
first (in steps too: where every draft fails a window of tokens is as many steps, and a stale
leader would run for all of them). Two comparisons, each over the same
tokens (a window's difficulty cancels), in logs:
- whether to lead: per arm, log(arm / policy) over the windows the policy ran, a discounted
  mean per workload (the regret against that arm). Against each arm, not against a per-window
  maximum over arms: the mean of a maximum is biased upwards (the winner's curse) and would
  lead where no arm is better. Windows are short and acceptance is bursty, so one window's
  ratio is noisy: the floor leads while some regret exceeds log(1 + margin) by `CONFIDENCE`
  standard errors — otherwise a chance excursion would start a lead that only the sparse
  probe windows (below) could end;
- whom to follow: per arm, log(arm / plain) over every window (arms are always scored), a
  mean that follows the last two or three — so the floor picks up a change of the best arm
  within a request at once, while the regret, measured only on the policy's windows, moves
  slower.
Leading, the next window follows the best arm (follow-the-leader over policies, as BanditSpec
and TapOut choose among speculation policies; the margin is the regret tolerated). Every
`PROBE_EVERY`-th window still goes to the policy, so the regret stays paired and current, and
the floor lets go once the policy catches up. Where the policy is at least as good as every
arm the floor never leads (`FloorState.followed` counts the steps it did).

It cannot correct the cost model: an arm's seconds are that model's predictions (the lock-in
of issue 14 is undone in the model itself: CostModel's stale slope).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from autospec.drafters.ngram import NgramIndex
from autospec.engine.accept import agreeing_prefix

PLAIN_ARM = ("none", 0)
WINDOW = 32  # output tokens per comparison window, at most
WINDOW_STEPS = 8  # steps per comparison window, at most
PROBE_EVERY = 4  # while the floor leads, every 4th window is the policy's own
MIN_WINDOWS = 1.5  # discounted paired windows before the floor may lead
REGRET_DISCOUNT = 0.9  # per paired window: the regret follows the last ~10
CONFIDENCE = 1.0  # standard errors by which a regret must clear the margin
ARM_DISCOUNT = 0.5  # per window: log(arm / plain) follows the last ~2


@dataclass
class FloorState:
    """Per workload: the policy's regret against each arm, and how the arms compare now."""
    regret: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # arm -> discounted
    # [count, sum, sum of squares] of log(arm rate / policy rate) over paired windows
    arms: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # arm -> the same
    # of log(arm rate / plain rate) over every window
    followed: int = 0  # steps on which the floor chose

    def observe(self, rates: dict[tuple[str, int], float], own_rate: float | None) -> None:
        """One window's rates of the arms (plain among them), and the policy's if it ran it."""
        plain = rates.get(PLAIN_ARM, 0.0)
        for arm, rate in rates.items():
            if rate <= 0:
                continue  # none of the arm's steps was decided in this window
            if own_rate:
                _fold(self.regret.setdefault(arm, [0.0, 0.0, 0.0]), math.log(rate / own_rate),
                      REGRET_DISCOUNT)
            if plain > 0:
                _fold(self.arms.setdefault(arm, [0.0, 0.0, 0.0]), math.log(rate / plain),
                      ARM_DISCOUNT)

    def leader(self, margin: float) -> tuple[str, int] | None:
        """The arm to follow while the policy trails some arm by more than `margin`, or None."""
        threshold = math.log1p(margin)
        if not any(n >= MIN_WINDOWS and _lower(n, s, sq) > threshold
                   for n, s, sq in self.regret.values()):
            return None
        # ties: the first (plain, then the shortest K)
        return max(self.arms, key=lambda arm: self.arms[arm][1] / self.arms[arm][0])


def _fold(sums: list[float], value: float, discount: float) -> None:
    """Discounted [count, sum, sum of squares] += value."""
    sums[0] = sums[0] * discount + 1
    sums[1] = sums[1] * discount + value
    sums[2] = sums[2] * discount + value * value


def _lower(n: float, total: float, squares: float) -> float:
    """The mean less CONFIDENCE standard errors, of n discounted observations."""
    mean = total / n
    variance = max(squares / n - mean * mean, 0.0)
    return mean - CONFIDENCE * math.sqrt(variance / n)


@dataclass
class _Arm:
    """One fixed arm replayed through one request: where its next step starts, and what its
    steps emitted and cost in the current window."""
    drafter: str
    k: int
    at: int  # the arm's context length: it drafts after request.tokens[:at]
    tokens: float = 0.0
    seconds: float = 0.0

    def close_window(self) -> float:
        """This window's rate (0 if none of its steps was decided), and a fresh window."""
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        self.tokens = self.seconds = 0.0
        return rate


class RequestFloor:
    """The floor's view of one request: the arms replayed through it, and the window."""

    def __init__(self, ks: tuple[int, ...], start: int):
        self.arms = [_Arm("none", 0, start)] + [_Arm("ngram", k, start) for k in ks]
        self.window_end = start + WINDOW
        self.own_seconds = 0.0  # the policy's measured seconds in this window
        self.own_tokens = 0
        self.steps = 0  # in this window
        self.windows = 0
        self.arm: tuple[str, int] | None = None  # the arm followed this window (None: policy)

    @property
    def led(self) -> bool:
        return self.arm is not None

    def choice(self) -> tuple[str, int] | None:
        """The (drafter, k) the floor imposes this step, or None: the policy decides."""
        return self.arm

    def observe(self, tokens: list[int], emitted: int, seconds: float, index: NgramIndex,
                verify_seconds, draft_per_token: float, floor: FloorState, margin: float) -> None:
        """After a step: replay the arms as far as `tokens` decides them; at a window's end,
        compare (if the policy ran it) and choose who runs the next one."""
        if not self.led:
            self.own_seconds += seconds
            self.own_tokens += emitted
        known = len(tokens)
        verify = verify_seconds.tolist() if hasattr(verify_seconds, "tolist") else verify_seconds
        looked: dict[int, list[int]] = {}  # at -> the longest arm's proposal there (shared)
        k_top = self.arms[-1].k
        for arm in self.arms:
            if not arm.k:  # plain decoding: one token a forward, whatever the tokens
                arm.tokens += known - arm.at
                arm.seconds += (known - arm.at) * verify[0]
                arm.at = known
                continue
            while arm.at < known:
                at = arm.at
                proposal = looked.get(at)
                if proposal is None:
                    proposal = looked[at] = index.propose(k_top, at=at)
                proposal = proposal[:arm.k]
                target = tokens[at:at + len(proposal) + 1]
                accepted = agreeing_prefix(proposal, target)
                if accepted == len(target):
                    break  # not decided yet: the target has not emitted past the draft
                arm.tokens += accepted + 1
                arm.seconds += verify[len(proposal)] + draft_per_token * len(proposal)
                arm.at = at + accepted + 1
        self.steps += 1
        if known < self.window_end and self.steps < WINDOW_STEPS:
            return
        rates = {(arm.drafter, arm.k): arm.close_window() for arm in self.arms}
        own = None if self.led or self.own_seconds <= 0 else self.own_tokens / self.own_seconds
        floor.observe(rates, own)
        self.windows += 1
        self.window_end = known + WINDOW
        self.own_seconds, self.own_tokens, self.steps = 0.0, 0, 0
        self.arm = floor.leader(margin) if self.windows % PROBE_EVERY else None
