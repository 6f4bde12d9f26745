"""Deprecated (one release): sampling moved to autospec.models.sampling, below drafters and engine."""
from autospec.moved import forward

__getattr__ = forward({name: "autospec.models.sampling"
                       for name in ("SamplingParams", "probs_from_logits", "sample")})
