"""A request row for controller tests that step no engine: the fields a controller reads."""
from __future__ import annotations

import torch

from autospec.engine.request import Request
from autospec.models.sampling import SamplingParams


def row(request_id: str, tokens: list[int], prompt_len: int, workload: str | None,
        max_new_tokens: int = 10 ** 6) -> Request:
    return Request(request_id, list(tokens), prompt_len, max_new_tokens, SamplingParams(),
                   torch.Generator(), workload=workload)
