"""autospec.store: telemetry summaries, learned estimates and applied policies in SQL.

    from autospec.store import open_store
    with open_store() as store:              # SQLite under the data dir, or any SQLAlchemy URL
        store.ingest(records, batch_id="engine-1:42", model_pair="reference", hardware="cpu")
        store.load_estimates("reference", "cpu")   # {workload: {drafter: Estimate}}
"""
from autospec.store.aggregates import StepAggregate, step_aggregates
from autospec.store.errors import StoreError, StoreSchemaError
from autospec.store.queries import AppliedPolicy, Estimate
from autospec.store.schema import ALL_WORKLOADS, SCHEMA_VERSION
from autospec.store.session import Store, data_dir, default_url, open_store

__all__ = [
    "ALL_WORKLOADS", "AppliedPolicy", "Estimate", "SCHEMA_VERSION", "StepAggregate", "Store",
    "StoreError", "StoreSchemaError", "data_dir", "default_url", "open_store", "step_aggregates",
]
