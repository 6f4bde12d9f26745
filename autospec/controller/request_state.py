"""What the adaptive controller keeps per request (estimates, the drafter in use, look-ups
seen at decide) and how a look-up drafter's proposal is scored against what the target emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.controller.estimates import AcceptanceEstimate
from autospec.drafters.base import agreeing_prefix


@dataclass
class _RequestState:
    """Per request: discounted estimates per drafter. Acceptance is bursty — a model copying
    its prompt, or looping, accepts whole drafts many steps in a row, then stops — so besides
    the estimate over all of a drafter's steps (hot = False) there is one over the steps that
    follow a fully accepted draft (hot = True), used right after one. A run of full accepts
    drives K up the way transformers' +2/-1 heuristic does, with K still chosen by expected
    tokens per second; where acceptance is not bursty both converge to the same rates."""
    acceptance: dict[tuple[str, bool], AcceptanceEstimate]  # (drafter, hot) -> estimate
    hot: dict[str, bool] = field(default_factory=dict)  # drafter -> last draft fully accepted
    current: int | None = None  # the drafter index last chosen (PLAIN = none)
    used: set = field(default_factory=set)  # drafters that have run in this request
    looked: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # look-up drafter ->
    # (context length, its proposal) at decide, scored counterfactually when another ran
    # [accepted, rejected] x D x k_max: the workload's pooled evidence the drafter-choice
    # draws add (explore_pooled)
    pooled: list | None = None


def _score(proposal: list[int], verified: list[int]) -> tuple[int, int]:
    """(proposed, accepted) a proposal would have scored against the tokens the target emitted.
    Only those are known; a proposal longer than they are is censored there (positions past
    it are left unobserved)."""
    matched = agreeing_prefix(proposal, verified)
    if matched == len(verified):  # censored: everything we can check was right
        return matched, matched
    return len(proposal), matched


def pooled_evidence(prior: dict[str, AcceptanceEstimate], drafters: tuple[str, ...], cap: float,
                    k_max: int) -> list | None:
    """[accepted, rejected], each D lists of k_max floats: a workload's pooled counts per
    drafter, each scaled to at most `cap` observations (at its best-seen position) — what a
    request's drafter-choice draws add to its own posterior (explore_pooled; None: 0)."""
    if not cap:
        return None
    accepted, rejected = [], []
    for drafter in drafters:
        ev_a, ev_b = prior[drafter].evidence_lists()
        seen = max(x + y for x, y in zip(ev_a, ev_b))
        scale = min(1.0, cap / seen) if seen > 0 else 0.0
        accepted.append([x * scale for x in ev_a] if seen > 0 else [0.0] * k_max)
        rejected.append([x * scale for x in ev_b] if seen > 0 else [0.0] * k_max)
    return [accepted, rejected]
