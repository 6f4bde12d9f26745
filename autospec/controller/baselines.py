"""Baseline controllers, kept in code for comparison (`ctl:NAME` in `autospec bench`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from autospec.controller.interface import Decision, RowController, Step
from autospec.telemetry import StepRecord

TIERS = (1, 2, 4, 8)  # ctl:ema's K tiers: powers of two up to the traces' usual K, as a user would
# batch size -> K for ctl:batch-table: K of the smallest size >= the batch, 0 above the last.
# A starting point, not a tuned table: on this CPU a forward of 16 rows x 5 tokens costs 5.6x
# one row x 1 token, so deep drafts stop paying well before 16 rows.
DEFAULT_BATCH_TABLE = ((1, 4), (4, 2), (8, 1))


@dataclass
class HFHeuristicController(RowController):
    """transformers' num_assistant_tokens_schedule="heuristic": +2 when every proposed token
    was accepted, else max(1, K - 1). Per request (its "heuristic_transient" variant)."""
    drafter: str = "draft-model"
    k0: int = 4
    k_max: int = 16
    _k: dict = field(default_factory=dict)

    def decide_row(self, request) -> Decision:
        return Decision(self.drafter, self._k.setdefault(request.request_id, self.k0))

    def observe_row(self, record: StepRecord, request) -> None:
        k = self._k.get(request.request_id, self.k0)
        full = record.proposed > 0 and record.accepted == record.proposed
        self._k[request.request_id] = min(self.k_max, k + 2) if full else max(1, k - 1)

    def release(self, request) -> None:
        self._k.pop(request.request_id, None)


@dataclass
class EMAController(RowController):
    """SGLang's --speculative-adaptive style: an EMA of accepted length mapped to K tiers —
    draft the smallest tier that exceeds what is expected to be accepted."""
    drafter: str = "draft-model"
    weight: float = 0.3
    tiers: tuple[int, ...] = TIERS
    _ema: dict = field(default_factory=dict)

    def decide_row(self, request) -> Decision:
        ema = self._ema.setdefault(request.request_id, float(self.tiers[len(self.tiers) // 2]) - 1)
        return Decision(self.drafter, next((t for t in self.tiers if t > ema), self.tiers[-1]))

    def observe_row(self, record: StepRecord, request) -> None:
        ema = self._ema.get(request.request_id, 0.0)
        self._ema[request.request_id] = (1 - self.weight) * ema + self.weight * record.accepted

    def release(self, request) -> None:
        self._ema.pop(request.request_id, None)


@dataclass
class BatchTableController(RowController):
    """vLLM's and TensorRT-LLM's batch size -> K table (TRT-LLM's draft_len_schedule): every
    row of a batch drafts the K of the smallest table size >= the batch size; above the
    largest size, K = 0 (plain decoding). Blind to acceptance: the baseline a cost model beats."""
    drafter: str = "draft-model"
    table: tuple[tuple[int, int], ...] = DEFAULT_BATCH_TABLE

    def k_for(self, batch_size: int) -> int:
        return next((k for size, k in self.table if batch_size <= size), 0)

    def decide(self, step: Step) -> list[Decision]:
        k = self.k_for(len(step.rows))
        return [Decision(self.drafter if k else None, k)] * len(step.rows)

    def decide_row(self, request) -> Decision:
        return self.decide(Step([request], None))[0]  # a request on its own: a batch of one
