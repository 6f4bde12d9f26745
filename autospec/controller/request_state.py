"""What the adaptive controller keeps per request (estimates, the drafter in use, look-ups
seen at decide) and how a look-up drafter's proposal is scored against what the target emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.controller.estimates import AcceptanceEstimate
from autospec.drafters.base import agreeing_prefix


@dataclass
class _RequestState:
    """Per request: estimates per drafter. Acceptance is bursty — a model copying
    its prompt, or looping, accepts whole drafts many steps in a row, then stops — so besides
    the estimate over all of a drafter's steps (hot = False) there is one over the steps that
    follow a fully accepted draft (hot = True), used right after one. A run of full accepts
    drives K up the way transformers' +2/-1 heuristic does, with K still chosen by expected
    tokens per second; where acceptance is not bursty both converge to the same rates."""
    acceptance: dict[tuple[str, bool], AcceptanceEstimate]  # (drafter, hot) -> estimate
    hot: dict[str, bool] = field(default_factory=dict)  # drafter -> last draft fully accepted
    used: set = field(default_factory=set)  # drafters that have run in this request
    looked: dict[str, tuple[int, list[int]]] = field(default_factory=dict)  # look-up drafter ->
    # (context length, its proposal) at decide, scored counterfactually when another ran


def _score(proposal: list[int], verified: list[int]) -> tuple[int, int]:
    """(proposed, accepted) a proposal would have scored against the tokens the target emitted.
    Only those are known; a proposal longer than they are is censored there (positions past
    it are left unobserved)."""
    matched = agreeing_prefix(proposal, verified)
    if matched == len(verified):  # censored: everything we can check was right
        return matched, matched
    return len(proposal), matched

