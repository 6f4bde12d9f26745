"""The store on real SQLite files: idempotent ingest, WAL, schema versions, failures."""
import dataclasses

import pytest
from sqlalchemy import event, inspect, select, text

from autospec.store import (Estimate, StepAggregate, StoreError, StoreSchemaError, default_url,
                            open_store, step_aggregates)
from autospec.confidence import Calibration
from autospec.store import migrations, schema
from autospec.store.schema import RequestRow, SchemaVersionRow, StepAggregateRow
from autospec.telemetry import RequestRecord, StepRecord, summarise


def step(request_id, i, drafter="ngram", k=4, proposed=4, accepted=2, emitted=3):
    return StepRecord(request_id, i, drafter, k, proposed, accepted, emitted,
                      draft_seconds=0.001, verify_seconds=0.01, verify_tokens=proposed + 1,
                      context_tokens=10 + i, bytes_moved=1_000_000, bandwidth_gbs=0.1)


def record(request_id, n_steps=4, workload="copy"):
    steps = [step(request_id, i, accepted=i % 3) for i in range(n_steps)]
    steps.append(step(request_id, n_steps, drafter="none", k=0, proposed=0, accepted=0, emitted=1))
    return summarise(request_id, 12, steps, wall_seconds=0.5, workload=workload)


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'autospec.db'}"


def test_step_aggregates_sums_per_drafter_and_k():
    steps = [step("r", 0, k=4, proposed=4, accepted=4, emitted=5),
             step("r", 1, k=4, proposed=3, accepted=1, emitted=2),
             step("r", 2, k=2, proposed=2, accepted=0, emitted=1),
             step("r", 3, drafter="none", k=0, proposed=0, accepted=0, emitted=1)]
    assert step_aggregates(steps) == [
        StepAggregate("ngram", 2, 1, 2, 0, 1, 3, 0.001, 0.01),
        StepAggregate("ngram", 4, 2, 7, 5, 7, 9, 0.002, 0.02),
        StepAggregate("none", 0, 1, 0, 0, 1, 1, 0.001, 0.01),
    ]
    assert step_aggregates([]) == []


def test_every_record_field_has_a_column():
    columns = set(RequestRow.__table__.c.keys())
    fields = {f.name for f in dataclasses.fields(RequestRecord)} - {"step_records"}
    assert fields <= columns
    assert all(t.startswith("autospec_") for t in schema.Base.metadata.tables)  # Optuna shares the file


def test_ingest_is_idempotent_per_batch(url):
    with open_store(url) as store:
        batch = [record("r1"), record("r2")]
        assert store.ingest(batch, "engine-a:1", "reference", "cpu") == 2
        # the same batch re-sent after a crash: nothing new
        assert store.ingest(batch, "engine-a:1", "reference", "cpu") == 0
        # a re-send that also carries a request the first send lacked: only that one
        assert store.ingest(batch + [record("r3")], "engine-a:1", "reference", "cpu") == 1
        assert store.count_requests() == 3
        assert store.count_requests(workload="copy", model_pair="reference", hardware="cpu") == 3
        assert store.count_requests(model_pair="other") == 0
        with store.session_scope(write=False) as session:
            row = session.scalar(select(RequestRow).where(RequestRow.request_id == "r1"))
            assert row.to_record() == dataclasses.replace(batch[0], step_records=[])
            aggs = {(a.drafter, a.k): a.steps for a in row.step_aggregates}
            assert aggs == {("ngram", 4): 4, ("none", 0): 1}
            assert session.scalar(select(StepAggregateRow.id).limit(1)) is not None


def test_ingest_refuses_a_batch_with_a_request_twice(url):
    with open_store(url) as store:
        with pytest.raises(ValueError, match="batch 'b' holds request 'r1' twice"):
            store.ingest([record("r1"), record("r1")], "b", "reference", "cpu")
        assert store.count_requests() == 0


def test_sqlite_runs_in_wal_mode(url):
    with open_store(url) as store, store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000


def test_default_store_lives_in_the_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOSPEC_DATA", str(tmp_path / "data"))
    with open_store() as store:
        store.ingest([record("r1")], "b", "reference", "cpu")
    assert (tmp_path / "data" / "autospec.db").is_file()
    monkeypatch.delenv("AUTOSPEC_DATA")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_url() == f"sqlite:///{tmp_path / 'xdg' / 'autospec' / 'autospec.db'}"


def test_estimates_round_trip_and_replace(url):
    with open_store(url) as store:
        first = Estimate("ngram", "copy", [0.9, 0.8], [10, 5], 1e-4, 0.04, 0.002)
        pooled = Estimate("draft-model", "*", [0.6], [3.5], 2e-3)
        assert store.save_estimates("reference", "cpu", [first, pooled]) == 2
        store.save_estimates("reference", "cpu", [dataclasses.replace(first, observations=(11, 6))])
        loaded = store.load_estimates("reference", "cpu")
        assert set(loaded) == {"copy", "*"}
        assert loaded["copy"]["ngram"].observations == (11.0, 6.0)  # replaced, not added
        assert loaded["copy"]["ngram"].updated_at.tzinfo is not None
        assert loaded["*"]["draft-model"].verify_base_seconds is None
        assert store.load_estimates("reference", "gpu") == {}
    with pytest.raises(ValueError, match=r"estimate ngram/copy: acceptance 1.5 not in \[0, 1\]"):
        Estimate("ngram", "copy", [1.5], [1])
    with pytest.raises(ValueError, match="2 entries but observations has 1"):
        Estimate("ngram", "copy", [0.5, 0.5], [1])


def test_applied_policies_in_order(url):
    with open_store(url) as store:
        store.record_policy("a" * 64, "policies/default.yaml", 1)
        store.record_policy("b" * 64, "policies/tuned.yaml", 1)
        assert [p.path for p in store.applied_policies()] == ["policies/default.yaml",
                                                              "policies/tuned.yaml"]


def _set_version(url, version):
    with open_store(url) as store, store.session_scope() as session:
        session.get(SchemaVersionRow, 1).version = version


def _drop_method(connection) -> None:
    """requests as schema 4 and earlier made it: no `method` column."""
    connection.execute(text("ALTER TABLE autospec_requests DROP COLUMN method"))


def test_newer_schema_is_refused_with_both_versions(url):
    _set_version(url, schema.SCHEMA_VERSION + 1)
    with pytest.raises(StoreSchemaError) as err:
        open_store(url)
    message = str(err.value)
    assert url in message
    assert f"schema version {schema.SCHEMA_VERSION + 1} is newer than this autospec's " \
           f"{schema.SCHEMA_VERSION}" in message


def test_older_schema_is_migrated_in_order_once(url, monkeypatch):
    with open_store(url) as store:
        store.ingest([record("r1")], "b", "reference", "cpu")
    ran = []

    current = schema.SCHEMA_VERSION

    def add_note(connection):  # a pretend next version: one new column
        ran.append(current)
        connection.execute(text("ALTER TABLE autospec_applied_policies ADD COLUMN note VARCHAR"))

    monkeypatch.setattr(schema, "SCHEMA_VERSION", current + 1)
    monkeypatch.setattr(migrations, "MIGRATIONS", [(current, add_note)])
    for _ in range(2):
        with open_store(url) as store:
            assert store.count_requests() == 1  # the data came along
            columns = {c["name"] for c in inspect(store.engine).get_columns("autospec_applied_policies")}
            assert "note" in columns
            with store.session_scope(write=False) as session:
                assert session.get(SchemaVersionRow, 1).version == current + 1
    assert ran == [current]  # migrated on the first open only


def test_failed_migration_leaves_the_old_schema(url, monkeypatch):
    open_store(url).close()

    current = schema.SCHEMA_VERSION

    def broken(connection):
        connection.execute(text("ALTER TABLE autospec_applied_policies ADD COLUMN note VARCHAR"))
        raise RuntimeError("migration bug")

    monkeypatch.setattr(schema, "SCHEMA_VERSION", current + 1)
    monkeypatch.setattr(migrations, "MIGRATIONS", [(current, broken)])
    with pytest.raises(RuntimeError, match="migration bug"):
        open_store(url)
    monkeypatch.setattr(migrations, "MIGRATIONS", [])
    with pytest.raises(StoreSchemaError,
                       match=f"no migration from schema version {current} to {current + 1}"):
        open_store(url)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", current)
    with open_store(url) as store:  # DDL rolled back with the transaction: still clean
        columns = {c["name"] for c in inspect(store.engine).get_columns("autospec_applied_policies")}
        assert "note" not in columns


def test_a_version_1_store_migrates_to_the_two_acceptance_names(url):
    """Schema 1 called the learnt P(accepted | earlier accepted) `acceptance_per_position`,
    the telemetry's name for P(accepted | proposed), and the controller's time
    `policy_seconds`; schema 2 renames both columns, keeping the rows."""
    with open_store(url) as store:
        store.ingest([record("r1")], "b", "reference", "cpu")
        store.save_estimates("reference", "cpu", [Estimate("ngram", "copy", [0.7, 0.5], [3, 1])])
        with store.engine.begin() as connection:  # back to what schema 1 wrote
            for table, old, new in (("estimates", "acceptance_per_position", "conditional_acceptance"),
                                    ("requests", "policy_seconds", "controller_seconds")):
                connection.execute(text(f"ALTER TABLE autospec_{table} RENAME COLUMN {new} TO {old}"))
            _drop_method(connection)
            connection.execute(text("UPDATE autospec_schema_version SET version = 1"))
    with open_store(url) as store:
        assert store.load_estimates("reference", "cpu")["copy"]["ngram"].conditional_acceptance \
            == (0.7, 0.5)
        columns = {c["name"] for c in inspect(store.engine).get_columns("autospec_requests")}
        assert "controller_seconds" in columns and "policy_seconds" not in columns
        with store.session_scope(write=False) as session:
            assert session.get(SchemaVersionRow, 1).version == schema.SCHEMA_VERSION


def test_telemetry_method_round_trips_and_old_records_without_it_parse():
    ran = dataclasses.replace(record("r1"), method="static:ngram:4")
    assert RequestRecord.from_dict(ran.to_dict()) == ran
    old = record("r1").to_dict()
    del old["method"]  # a client from before the field
    assert RequestRecord.from_dict(old).method is None
    with pytest.raises(ValueError, match=r"RequestRecord.method: expected a string, got 4"):
        RequestRecord.from_dict({**old, "method": 4})


def test_read_only_store_raises_store_error_and_keeps_data(tmp_path, url):
    with open_store(url) as store:
        store.ingest([record("r1")], "b1", "reference", "cpu")
    read_only = f"sqlite:///file:{tmp_path / 'autospec.db'}?mode=ro&uri=true"
    with open_store(read_only) as store:
        assert store.count_requests() == 1  # reading still works
        with pytest.raises(StoreError, match="readonly database") as err:
            store.ingest([record("r2")], "b2", "reference", "cpu")
        assert read_only in str(err.value)
    with open_store(url) as store:
        assert store.count_requests() == 1


def test_full_disk_raises_store_error_and_keeps_committed(url):
    with open_store(url) as store:
        store.ingest([record("r1")], "b1", "reference", "cpu")

        @event.listens_for(store.engine, "connect")
        def cap_size(dbapi_connection, _record):  # a disk with no free page left
            pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
            dbapi_connection.execute(f"PRAGMA max_page_count = {pages}")

        store.engine.dispose()  # new connections, capped
        big = [record(f"q{i}", n_steps=30) for i in range(300)]
        with pytest.raises(StoreError, match="database or disk is full") as err:
            store.ingest(big, "b2", "reference", "cpu")
        assert url in str(err.value)
        assert store.count_requests() == 1  # the failed batch is gone as a whole, r1 stays


def test_bad_url_names_it():
    with pytest.raises(StoreError, match="store nosuchdb://x: not a usable SQLAlchemy URL"):
        open_store("nosuchdb://x")
    with pytest.raises(StoreError, match="cannot open"):
        open_store("sqlite:////nonexistent-dir/sub/autospec.db")


def test_batch_cost_round_trip_and_a_v2_store_gains_the_table(url):
    state = {"xtx": [float(i) for i in range(9)], "xty": [1.0, 2.0, 3.0], "observed": 4.5}
    with open_store(url) as store:
        assert store.load_batch_cost("reference", "cpu") is None
        store.save_batch_cost("reference", "cpu", state)
        store.save_batch_cost("reference", "cpu", {**state, "observed": 5.0})  # replaced
        assert store.load_batch_cost("reference", "cpu") == {**state, "observed": 5.0}
        assert store.load_batch_cost("reference", "gpu") is None
        store.ingest([record("r1")], "b", "reference", "cpu")
    # the store as schema version 2 left it: no batch_costs table
    with open_store(url) as store, store.session_scope() as session:
        session.execute(text("DROP TABLE autospec_batch_costs"))
        _drop_method(session)
        session.get(SchemaVersionRow, 1).version = 2
    with open_store(url) as store:
        assert store.count_requests() == 1
        assert store.load_batch_cost("reference", "cpu") is None  # the table is back, empty
        with store.session_scope(write=False) as session:
            assert session.get(SchemaVersionRow, 1).version == schema.SCHEMA_VERSION


def test_a_v3_store_keys_what_was_learnt_by_instance_and_keeps_its_rows(url):
    """Schema 4 adds `instance` to the unique keys of estimates and batch_costs (a fleet of
    daemons on one store); a v3 store's rows become instance "" (a lone daemon's)."""
    saved = Estimate("ngram", "copy", [0.7, 0.5], [3, 1], 1e-4, 0.01, 0.002)
    state = {"xtx": [1.0] * 9, "xty": [1.0, 2.0, 3.0], "observed": 4.0}
    with open_store(url) as store:
        store.save_estimates("reference", "cpu", [saved])
        store.save_batch_cost("reference", "cpu", state)
    with open_store(url) as store, store.session_scope() as session:  # as schema 3 wrote them
        for table, key in (("estimates", "model_pair, drafter, workload, hardware"),
                           ("batch_costs", "model_pair, hardware")):
            columns = [c for c in schema.Base.metadata.tables[f"autospec_{table}"].columns.keys()
                       if c != "instance"]
            session.execute(text(f"CREATE TABLE old_{table} AS SELECT {', '.join(columns)} "
                                 f"FROM autospec_{table}"))
            session.execute(text(f"DROP TABLE autospec_{table}"))
            session.execute(text(f"CREATE TABLE autospec_{table} (id INTEGER PRIMARY KEY, "
                                 f"{', '.join(c + ' ' for c in columns[1:])}, UNIQUE ({key}))"))
            session.execute(text(f"INSERT INTO autospec_{table} SELECT * FROM old_{table}"))
            session.execute(text(f"DROP TABLE old_{table}"))
        _drop_method(session)
        session.get(SchemaVersionRow, 1).version = 3
    with open_store(url) as store:
        assert store.load_estimates("reference", "cpu")["copy"]["ngram"] == \
            dataclasses.replace(saved, updated_at=store.load_estimates("reference", "cpu")
                                ["copy"]["ngram"].updated_at)
        assert store.load_batch_cost("reference", "cpu") == state
        # two instances now keep rows side by side under one (pair, drafter, workload, hardware)
        store.save_estimates("reference", "cpu", [Estimate("ngram", "copy", [0.2], [5])], "b")
        store.save_batch_cost("reference", "cpu", {**state, "observed": 1.0}, "b")
        estimates, batch_costs = store.fleet("reference", "cpu")
        assert sorted(estimates) == sorted(batch_costs) == ["", "b"]
        assert estimates[""]["copy"]["ngram"].conditional_acceptance == (0.7, 0.5)
        assert estimates["b"]["copy"]["ngram"].conditional_acceptance == (0.2,)
        with store.session_scope(write=False) as session:
            assert session.get(SchemaVersionRow, 1).version == schema.SCHEMA_VERSION


def _rows_but_method(store) -> list[dict]:
    with store.engine.connect() as connection:
        rows = connection.execute(text("SELECT * FROM autospec_requests ORDER BY id"))
        return [{c: v for c, v in row._mapping.items() if c != "method"} for row in rows]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_v4_store_gains_the_method_column_and_keeps_its_rows(backend, url, request):
    """Schema 5 adds requests.method (nullable): a v4 store's rows keep every field, their
    method NULL ("not said"); new rows keep theirs."""
    if backend == "postgresql":
        url = request.getfixturevalue("postgres_url")
    with open_store(url) as store:
        store.ingest([record("r1"), record("r2", workload=None)], "b1", "reference", "cpu")
        with store.engine.begin() as connection:  # back to what schema 4 wrote
            _drop_method(connection)
            connection.execute(text("UPDATE autospec_schema_version SET version = 4"))
        before = _rows_but_method(store)
    with open_store(url) as store:
        with store.session_scope(write=False) as session:
            assert session.get(SchemaVersionRow, 1).version == schema.SCHEMA_VERSION
            rows = session.scalars(select(RequestRow).order_by(RequestRow.id)).all()
            assert [r.to_record() for r in rows] == [
                dataclasses.replace(record(r.request_id, workload=r.workload), step_records=[])
                for r in rows]
            assert [r.method for r in rows] == [None, None]
        assert _rows_but_method(store) == before  # every row, every column
        store.ingest([dataclasses.replace(record("r3"), method="plain")], "b2", "reference", "cpu")
        with store.session_scope(write=False) as session:
            assert session.scalar(select(RequestRow.method)
                                  .where(RequestRow.request_id == "r3")) == "plain"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_v5_store_gains_the_calibration_column_and_keeps_its_estimates(backend, url, request):
    """Schema 6 adds estimates.calibration (nullable): a v5 store's estimates load as they
    were, with none learnt; an estimate with a calibration round-trips."""
    if backend == "postgresql":
        url = request.getfixturevalue("postgres_url")
    old = Estimate("ngram", "copy", (0.9, 0.8), (10.0, 5.0), 1e-6, 0.01, 0.001)
    with open_store(url) as store:
        store.save_estimates("reference", "cpu", [old])
        with store.engine.begin() as connection:  # back to what schema 5 wrote
            connection.execute(text("ALTER TABLE autospec_estimates DROP COLUMN calibration"))
            connection.execute(text("UPDATE autospec_schema_version SET version = 5"))
    with open_store(url) as store:
        with store.session_scope(write=False) as session:
            assert session.get(SchemaVersionRow, 1).version == schema.SCHEMA_VERSION == 6
        kept = store.load_estimates("reference", "cpu")["copy"]["ngram"]
        assert dataclasses.replace(kept, updated_at=None) == old and kept.calibration is None
        learnt = Calibration()
        learnt.update([0.9, 0.2], 1, [0.5, 0.5])
        store.save_estimates("reference", "cpu",
                             [dataclasses.replace(old, calibration=learnt.state())])
        kept = store.load_estimates("reference", "cpu")["copy"]["ngram"]
        assert kept.calibration == learnt.state()
    with pytest.raises(ValueError, match="estimate ngram/copy: calibration.seen"):
        dataclasses.replace(old, calibration={"kept": [0.0] * 20, "seen": [1.0]})
