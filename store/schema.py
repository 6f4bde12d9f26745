"""The store's tables: SQLAlchemy 2 declarative models, every table prefixed `autospec_`.

The prefix lets Optuna's own tables (`studies`, `trials`, ...) share one database file with
ours. `SCHEMA_VERSION` is what these models describe; bump it together with a new entry in
`migrations.MIGRATIONS` whenever a table changes.

Rows are keyed by (model pair, hardware) strings chosen by the caller, e.g. model pair
"reference" or "TARGET+DRAFT", hardware "cpu:2xEPYC"; the store does not parse them. What a
daemon learnt is keyed by its `instance` too ("" for a lone daemon): daemons sharing one store
(a fleet) each write their own rows and read the others' (autospec/daemon/state.py).
"""
from __future__ import annotations

import dataclasses
from datetime import datetime, timezone

from sqlalchemy import (JSON, BigInteger, DateTime, Float, ForeignKey, Integer, String,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from autospec.telemetry import POOLED, RequestRecord

SCHEMA_VERSION = 6  # 2: estimates.conditional_acceptance, requests.controller_seconds;
# 3: batch_costs; 4: estimates and batch_costs keyed by daemon instance too (a fleet);
# 5: requests.method; 6: estimates.calibration
TABLE_PREFIX = "autospec_"
ALL_WORKLOADS = POOLED  # the workload key of estimates pooled over every workload

# Wide enough for a hub id + local path pair; PostgreSQL enforces lengths, SQLite does not.
_KEY = String(512)
_INSTANCE = String(256)  # a daemon's --instance name; "" = a lone daemon (and rows before v4)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class SchemaVersionRow(Base):
    """One row (id = 1): the schema version the tables were last created or migrated to."""
    __tablename__ = TABLE_PREFIX + "schema_version"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class RequestRow(Base):
    """One RequestRecord (telemetry.py), its scalar fields as columns, lists/dicts as JSON.

    (batch_id, request_id) is unique: a batch re-sent after a crash is stored once."""
    __tablename__ = TABLE_PREFIX + "requests"
    __table_args__ = (UniqueConstraint("batch_id", "request_id",
                                       name=TABLE_PREFIX + "requests_batch_request"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(String(128), index=True)
    request_id: Mapped[str] = mapped_column(String(256))
    model_pair: Mapped[str] = mapped_column(_KEY, index=True)
    hardware: Mapped[str] = mapped_column(_KEY)
    ingested_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
    # -- RequestRecord's fields, same names -------------------------------------------------
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    proposed: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    acceptance_rate: Mapped[float] = mapped_column(Float)
    mean_accepted_length: Mapped[float] = mapped_column(Float)  # includes the bonus token
    acceptance_per_position: Mapped[list] = mapped_column(JSON)  # [P(pos j+1 kept | proposed)]
    drafter_shares: Mapped[dict] = mapped_column(JSON)  # {drafter: share of steps}
    draft_seconds: Mapped[float] = mapped_column(Float)
    verify_seconds: Mapped[float] = mapped_column(Float)
    wall_seconds: Mapped[float] = mapped_column(Float)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    bytes_moved: Mapped[int] = mapped_column(BigInteger)  # > 2**31 after a few steps
    bandwidth_gbs: Mapped[float] = mapped_column(Float)
    controller_seconds: Mapped[float] = mapped_column(Float)
    workload: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)
    finish_reason: Mapped[str] = mapped_column(String(32))
    # "plain", "adaptive", "static:ngram:4", "adaptive:POLICY.yaml" (a path: as wide as one);
    # NULL = not said (rows from before v5, clients that do not send it)
    method: Mapped[str | None] = mapped_column(String(1024), nullable=True)

    step_aggregates: Mapped[list["StepAggregateRow"]] = relationship(
        back_populates="request", cascade="all, delete-orphan", passive_deletes=True)

    def to_record(self) -> RequestRecord:
        """The RequestRecord back (without step_records: the store keeps aggregates only)."""
        names = [f.name for f in dataclasses.fields(RequestRecord) if f.name != "step_records"]
        return RequestRecord(**{n: getattr(self, n) for n in names})


# RequestRecord fields stored as columns of RequestRow (everything but the steps).
RECORD_COLUMNS = tuple(f.name for f in dataclasses.fields(RequestRecord) if f.name != "step_records")


class StepAggregateRow(Base):
    """Per request, per (drafter, k): sums over its steps (see aggregates.step_aggregates)."""
    __tablename__ = TABLE_PREFIX + "step_aggregates"
    __table_args__ = (UniqueConstraint("request_pk", "drafter", "k",
                                       name=TABLE_PREFIX + "step_aggregates_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    request_pk: Mapped[int] = mapped_column(
        ForeignKey(RequestRow.id, ondelete="CASCADE"), index=True)
    drafter: Mapped[str] = mapped_column(String(128))  # "none" for plain steps
    k: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    proposed: Mapped[int] = mapped_column(Integer)
    accepted: Mapped[int] = mapped_column(Integer)
    emitted: Mapped[int] = mapped_column(Integer)
    verify_tokens: Mapped[int] = mapped_column(Integer)  # for verify-cost fits: tokens per forward
    draft_seconds: Mapped[float] = mapped_column(Float)
    verify_seconds: Mapped[float] = mapped_column(Float)

    request: Mapped[RequestRow] = relationship(back_populates="step_aggregates")


class EstimateRow(Base):
    """The slow path's learned state per (model pair, drafter, workload, hardware).

    workload POOLED ("*") = pooled over all workloads. conditional_acceptance[j] = P(draft position j+1
    accepted | positions 1..j accepted) with the (discounted) number of observations behind each; draft seconds
    per drafted token; verify seconds v(n) = base + slope * n for a forward over n tokens."""
    __tablename__ = TABLE_PREFIX + "estimates"
    __table_args__ = (UniqueConstraint("model_pair", "drafter", "workload", "hardware", "instance",
                                       name=TABLE_PREFIX + "estimates_instance_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_pair: Mapped[str] = mapped_column(_KEY)
    drafter: Mapped[str] = mapped_column(String(128))
    workload: Mapped[str] = mapped_column(String(128))
    hardware: Mapped[str] = mapped_column(_KEY)
    conditional_acceptance: Mapped[list] = mapped_column(JSON)  # [k_max] floats in [0, 1]
    observations: Mapped[list] = mapped_column(JSON)  # [k_max] floats >= 0
    draft_seconds_per_token: Mapped[float | None] = mapped_column(Float, nullable=True)
    verify_base_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    verify_slope_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # per token
    # confidence -> P(accepted) per bin (autospec/confidence.py: kept, seen, predicted); NULL:
    # none learnt (rows from before v6)
    calibration: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    instance: Mapped[str] = mapped_column(_INSTANCE, default="", server_default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class BatchCostRow(Base):
    """The slow path's batch cost per (model pair, hardware): the sufficient statistics of
    s(B, T) = a + b B + c T (autospec/controller/batch.py, BatchCost.state())."""
    __tablename__ = TABLE_PREFIX + "batch_costs"
    __table_args__ = (UniqueConstraint("model_pair", "hardware", "instance",
                                       name=TABLE_PREFIX + "batch_costs_instance_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model_pair: Mapped[str] = mapped_column(_KEY)
    hardware: Mapped[str] = mapped_column(_KEY)
    state: Mapped[dict] = mapped_column(JSON)  # {"xtx": [9], "xty": [3], "observed": float}
    instance: Mapped[str] = mapped_column(_INSTANCE, default="", server_default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)


class AppliedPolicyRow(Base):
    """Every policy file the daemon put in force, in order: which parameters ran when."""
    __tablename__ = TABLE_PREFIX + "applied_policies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy_hash: Mapped[str] = mapped_column(String(64), index=True)
    path: Mapped[str] = mapped_column(String(1024))
    schema_version: Mapped[int] = mapped_column(Integer)  # the policy file's, not the store's
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utc_now)
