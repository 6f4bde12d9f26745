"""Small query helpers over the tables, each taking an open Session (see session.Store for the
versions that open their own transaction). Results are plain frozen dataclasses, never ORM rows,
so they stay valid after the session closes."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autospec.store.aggregates import step_aggregates
from autospec.store.schema import (ALL_WORKLOADS, RECORD_COLUMNS, AppliedPolicyRow, BatchCostRow,
                                   EstimateRow, RequestRow, StepAggregateRow)
from autospec.confidence import Calibration
from autospec.telemetry import RequestRecord


@dataclass(frozen=True)
class Estimate:
    """Learned state for one drafter on one workload (POOLED, "*" = over all workloads).

    conditional_acceptance[j] = P(draft position j+1 accepted | positions 1..j accepted),
    observations[j] = the (discounted) verified drafts behind it; both length k_max.
    Seconds: per drafted token, and verify v(n) = base + slope * n for n tokens in a forward."""
    drafter: str
    workload: str
    conditional_acceptance: tuple[float, ...]
    observations: tuple[float, ...]
    draft_seconds_per_token: float | None = None
    verify_base_seconds: float | None = None
    verify_slope_seconds: float | None = None
    updated_at: datetime | None = None  # set by the store when saved
    # the drafter's confidence calibration on this workload (autospec.confidence.Calibration's
    # state: kept / seen / predicted per bin); None: none learnt (rows before schema 6)
    calibration: dict | None = None

    def __post_init__(self):
        acc = tuple(float(a) for a in self.conditional_acceptance)
        obs = tuple(float(o) for o in self.observations)
        where = f"estimate {self.drafter}/{self.workload}"
        if len(acc) != len(obs):
            raise ValueError(f"{where}: conditional_acceptance has {len(acc)} entries but "
                             f"observations has {len(obs)}; expected one per draft position")
        for a in acc:
            if not 0.0 <= a <= 1.0:  # also refuses NaN
                raise ValueError(f"{where}: acceptance {a!r} not in [0, 1]")
        for o in obs:
            if not o >= 0.0 or math.isinf(o):
                raise ValueError(f"{where}: observation count {o!r} not a finite number >= 0")
        object.__setattr__(self, "conditional_acceptance", acc)
        object.__setattr__(self, "observations", obs)
        if self.calibration is not None:
            try:
                state = Calibration.from_state(self.calibration).state()
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            object.__setattr__(self, "calibration", state)


@dataclass(frozen=True)
class AppliedPolicy:
    policy_hash: str
    path: str
    schema_version: int
    applied_at: datetime


def _key(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _utc(moment: datetime | None) -> datetime | None:
    # SQLite keeps no zone: what went in as UTC comes back naive
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=timezone.utc)
    return moment


def ingest(session: Session, records: Iterable[RequestRecord], batch_id: str, model_pair: str,
           hardware: str) -> int:
    """Store each record (summary + step aggregates) once; returns how many were new.

    Idempotent per (batch_id, request_id): a batch re-sent after a crash stores only what is
    missing (nothing, when the first send was committed: a batch commits as a whole)."""
    _key("batch_id", batch_id), _key("model_pair", model_pair), _key("hardware", hardware)
    records = list(records)
    seen: set[str] = set()
    for r in records:
        if not isinstance(r, RequestRecord):
            raise TypeError(f"ingest: expected RequestRecord, got {type(r).__name__} "
                            f"(parse JSON with RequestRecord.from_dict first)")
        if r.request_id in seen:
            raise ValueError(f"batch {batch_id!r} holds request {r.request_id!r} twice")
        seen.add(r.request_id)
    stored = set(session.scalars(select(RequestRow.request_id)
                                 .where(RequestRow.batch_id == batch_id)))
    new = [r for r in records if r.request_id not in stored]
    for r in new:
        fields = {n: getattr(r, n) for n in RECORD_COLUMNS}
        # numpy scalars (float32) are not JSON; plain floats are
        fields["acceptance_per_position"] = [float(a) for a in r.acceptance_per_position]
        fields["drafter_shares"] = {str(d): float(s) for d, s in r.drafter_shares.items()}
        row = RequestRow(batch_id=batch_id, model_pair=model_pair, hardware=hardware, **fields)
        row.step_aggregates = [StepAggregateRow(**vars(a)) for a in step_aggregates(r.step_records)]
        session.add(row)
    session.flush()
    return len(new)


def count_requests(session: Session, model_pair: str | None = None, hardware: str | None = None,
                   workload: str | None = None) -> int:
    """Stored request summaries, optionally only those matching every given key."""
    query = select(func.count(RequestRow.id))
    for column, value in ((RequestRow.model_pair, model_pair), (RequestRow.hardware, hardware),
                          (RequestRow.workload, workload)):
        if value is not None:
            query = query.where(column == value)
    return int(session.scalar(query))


def load_estimates(session: Session, model_pair: str, hardware: str,
                   instance: str = "") -> dict[str, dict[str, Estimate]]:
    """{workload: {drafter: Estimate}} one daemon instance learnt for a model pair on one
    hardware ({} if none yet)."""
    return fleet_estimates(session, model_pair, hardware, instance).get(instance, {})


def fleet_estimates(session: Session, model_pair: str, hardware: str,
                    instance: str | None = None) -> dict[str, dict[str, dict[str, Estimate]]]:
    """{instance: {workload: {drafter: Estimate}}}: what every daemon sharing this store
    learnt for a model pair on one hardware (only `instance`'s when given)."""
    query = select(EstimateRow).where(EstimateRow.model_pair == model_pair,
                                      EstimateRow.hardware == hardware)
    if instance is not None:
        query = query.where(EstimateRow.instance == instance)
    out: dict[str, dict[str, dict[str, Estimate]]] = {}
    for row in session.scalars(query):
        out.setdefault(row.instance, {}).setdefault(row.workload, {})[row.drafter] = Estimate(
            row.drafter, row.workload, row.conditional_acceptance, row.observations,
            row.draft_seconds_per_token, row.verify_base_seconds, row.verify_slope_seconds,
            _utc(row.updated_at), row.calibration)
    return out


def save_estimates(session: Session, model_pair: str, hardware: str,
                   estimates: Iterable[Estimate], instance: str = "") -> int:
    """Insert or replace each estimate under (model pair, drafter, workload, hardware,
    instance); returns how many were written. updated_at is set to now (UTC)."""
    _key("model_pair", model_pair), _key("hardware", hardware)
    written = 0
    for est in estimates:
        if not isinstance(est, Estimate):
            raise TypeError(f"save_estimates: expected Estimate, got {type(est).__name__}")
        workload = est.workload or ALL_WORKLOADS
        row = session.scalar(select(EstimateRow).where(
            EstimateRow.model_pair == model_pair, EstimateRow.hardware == hardware,
            EstimateRow.drafter == est.drafter, EstimateRow.workload == workload,
            EstimateRow.instance == instance))
        if row is None:
            row = EstimateRow(model_pair=model_pair, hardware=hardware, drafter=est.drafter,
                              workload=workload, instance=instance)
            session.add(row)
        row.conditional_acceptance = list(est.conditional_acceptance)
        row.observations = list(est.observations)
        row.draft_seconds_per_token = est.draft_seconds_per_token
        row.verify_base_seconds = est.verify_base_seconds
        row.verify_slope_seconds = est.verify_slope_seconds
        row.calibration = est.calibration
        row.updated_at = datetime.now(timezone.utc)
        written += 1
    session.flush()
    return written


def load_batch_cost(session: Session, model_pair: str, hardware: str,
                    instance: str = "") -> dict | None:
    """One daemon instance's saved step cost (StepCost.state(); the table keeps the name an
    older version gave its batch cost) for one pair and hardware, or None."""
    return fleet_batch_costs(session, model_pair, hardware, instance).get(instance)


def fleet_batch_costs(session: Session, model_pair: str, hardware: str,
                      instance: str | None = None) -> dict[str, dict]:
    """{instance: StepCost.state()} of every daemon sharing this store (or only `instance`)."""
    query = select(BatchCostRow).where(BatchCostRow.model_pair == model_pair,
                                       BatchCostRow.hardware == hardware)
    if instance is not None:
        query = query.where(BatchCostRow.instance == instance)
    return {row.instance: dict(row.state) for row in session.scalars(query)}


def save_batch_cost(session: Session, model_pair: str, hardware: str, state: dict,
                    instance: str = "") -> None:
    """Insert or replace the step cost's state under (model pair, hardware, instance)."""
    _key("model_pair", model_pair), _key("hardware", hardware)
    row = session.scalar(select(BatchCostRow).where(BatchCostRow.model_pair == model_pair,
                                                    BatchCostRow.hardware == hardware,
                                                    BatchCostRow.instance == instance))
    if row is None:
        row = BatchCostRow(model_pair=model_pair, hardware=hardware, instance=instance)
        session.add(row)
    row.state = dict(state)
    row.updated_at = datetime.now(timezone.utc)
    session.flush()


def record_policy(session: Session, policy_hash: str, path: str, schema_version: int) -> None:
    """Note that a policy file was put in force now."""
    session.add(AppliedPolicyRow(policy_hash=_key("policy_hash", policy_hash), path=str(path),
                                 schema_version=int(schema_version)))
    session.flush()


def applied_policies(session: Session) -> list[AppliedPolicy]:
    """Every policy put in force, oldest first (the last one is the one in force)."""
    rows = session.scalars(select(AppliedPolicyRow).order_by(AppliedPolicyRow.id))
    return [AppliedPolicy(r.policy_hash, r.path, r.schema_version, _utc(r.applied_at))
            for r in rows]
