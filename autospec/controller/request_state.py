"""What the adaptive controller keeps per request (estimates, the drafter in use, look-ups
seen at decide) and how a look-up drafter's proposal is scored against what the target emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.controller.estimates import AcceptanceEstimate
from autospec.drafters.base import agreeing_prefix


@dataclass
class _RequestState:
    """Per request: acceptance per position per drafter (`regimes`, a second estimate for the
    steps right after a fully accepted draft, went once each token's confidence priced it:
    with it on or off replay moved less than the noise, docs/controller.md)."""
    acceptance: dict[str, AcceptanceEstimate]  # drafter -> estimate
    used: set = field(default_factory=set)  # drafters that have run in this request
    # look-up drafter -> (context length, its proposal, its confidences) at decide: the step
    # drafts it, or it is scored counterfactually when another drafter ran
    looked: dict[str, tuple[int, list[int], list[float] | None]] = field(default_factory=dict)


def _score(proposal: list[int], verified: list[int]) -> tuple[int, int]:
    """(proposed, accepted) a proposal would have scored against the tokens the target emitted.
    Only those are known; a proposal longer than they are is censored there (positions past
    it are left unobserved)."""
    matched = agreeing_prefix(proposal, verified)
    if matched == len(verified):  # censored: everything we can check was right
        return matched, matched
    return len(proposal), matched

