"""Opening a store: the engine, SQLite settings, the schema check, and `session_scope()`.

Like Optuna's RDB storage: one engine per process, every unit of work in one
`session_scope()` (commit on success, roll back on any error). Any SQLAlchemy URL works; the
default is a SQLite file in the user's data directory. Optuna's docs warn against many
parallel writers on one SQLite file: for a fleet, point every process at PostgreSQL.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import Session, sessionmaker

from autospec.paths import STORE_FILENAME, data_dir, store_url
import autospec.store.migrations as migrations
import autospec.store.queries as queries
from autospec.store.errors import StoreError
from autospec.telemetry import RequestRecord

# Where the default store lives is autospec.paths' to say; these names stay for importers.
DB_FILENAME = STORE_FILENAME
default_url = store_url

def _sqlite_settings(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        # We emit BEGIN ourselves (below): Python's sqlite3 would otherwise autocommit DDL,
        # so a failed migration could leave a half-migrated schema behind.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # wait for another writer's lock instead of failing at once ("database is locked")
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        # WAL: readers never block the writer (a daemon writing while a tuner reads).
        # synchronous=NORMAL is durable against a killed process (kill -9) and, in WAL mode,
        # can lose only the last commits on power loss, never corrupt the file.
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection):
        # Writers take the write lock up front (BEGIN IMMEDIATE): a deferred transaction that
        # reads, then writes, can fail to upgrade its lock with no busy wait at all.
        connection.exec_driver_sql(connection.get_execution_options().get("autospec_begin", "BEGIN"))


def _hidden(url: str) -> str:
    """The URL as the user wrote it, unless it holds a password (then masked as ***)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    return url if parsed.password is None else parsed.render_as_string(hide_password=True)


class Store:
    """An open store. Query helpers run in their own transaction; for several steps in one
    transaction use `with store.session_scope() as session:` and the functions in `queries`."""

    def __init__(self, engine: Engine, url: str):
        self.engine = engine
        self.url = url  # password hidden: safe to print
        self._sqlite = engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    def error(self, exc: DBAPIError) -> StoreError:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return StoreError(f"store {self.url}: {reason} (this transaction was rolled back; "
                          f"everything committed before it is kept)")

    @contextmanager
    def session_scope(self, write: bool = True) -> Iterator[Session]:
        """A Session in one transaction: committed on leaving, rolled back on any error.
        Database failures come out as StoreError naming this store's URL."""
        session = self._sessions()
        try:
            if write and self._sqlite:
                session.connection(execution_options={"autospec_begin": "BEGIN IMMEDIATE"})
            yield session
            session.commit()
        except DBAPIError as exc:
            _quiet_rollback(session)
            raise self.error(exc) from exc
        except BaseException:
            _quiet_rollback(session)
            raise
        finally:
            session.close()

    # -- query helpers, one transaction each -----------------------------------------------
    def ingest(self, records: Iterable[RequestRecord], batch_id: str, model_pair: str,
               hardware: str) -> int:
        """Store a batch of RequestRecords once; returns how many were new (0 on a re-send)."""
        with self.session_scope() as session:
            return queries.ingest(session, records, batch_id, model_pair, hardware)

    def count_requests(self, model_pair: str | None = None, hardware: str | None = None,
                       workload: str | None = None) -> int:
        with self.session_scope(write=False) as session:
            return queries.count_requests(session, model_pair, hardware, workload)

    def load_estimates(self, model_pair: str, hardware: str,
                       instance: str = "") -> dict[str, dict[str, queries.Estimate]]:
        """{workload: {drafter: Estimate}}; workload POOLED ("*") = over all workloads."""
        with self.session_scope(write=False) as session:
            return queries.load_estimates(session, model_pair, hardware, instance)

    def save_estimates(self, model_pair: str, hardware: str,
                       estimates: Iterable[queries.Estimate], instance: str = "") -> int:
        with self.session_scope() as session:
            return queries.save_estimates(session, model_pair, hardware, estimates, instance)

    def load_batch_cost(self, model_pair: str, hardware: str, instance: str = "") -> dict | None:
        with self.session_scope(write=False) as session:
            return queries.load_batch_cost(session, model_pair, hardware, instance)

    def save_batch_cost(self, model_pair: str, hardware: str, state: dict,
                        instance: str = "") -> None:
        with self.session_scope() as session:
            queries.save_batch_cost(session, model_pair, hardware, state, instance)

    def fleet(self, model_pair: str, hardware: str) -> tuple[dict, dict]:
        """What every daemon instance sharing this store learnt for one pair and hardware, in
        one read: ({instance: {workload: {drafter: Estimate}}}, {instance: batch cost state})."""
        with self.session_scope(write=False) as session:
            return (queries.fleet_estimates(session, model_pair, hardware),
                    queries.fleet_batch_costs(session, model_pair, hardware))

    def record_policy(self, policy_hash: str, path: str, schema_version: int) -> None:
        with self.session_scope() as session:
            queries.record_policy(session, policy_hash, path, schema_version)

    def applied_policies(self) -> list[queries.AppliedPolicy]:
        with self.session_scope(write=False) as session:
            return queries.applied_policies(session)


def _quiet_rollback(session: Session) -> None:
    try:
        session.rollback()
    except DBAPIError:
        pass  # the connection is gone; the database discards the open transaction itself


def open_store(url: str | None = None, *, busy_timeout_s: float = 10.0) -> Store:
    """Open (creating or migrating as needed) the store at a SQLAlchemy URL.

    None = a SQLite file `autospec.db` under data_dir(). Raises StoreSchemaError for a store
    newer than this code, StoreError when the database cannot be opened or written."""
    if url is None:
        data_dir().mkdir(parents=True, exist_ok=True)
        url = default_url()
    shown = _hidden(url)
    try:
        engine = create_engine(url)
    except ImportError as exc:  # a known dialect whose driver is not installed
        raise StoreError(f"store {shown}: its database driver is not installed ({exc}); "
                         f"pip install it, e.g. psycopg for postgresql://") from None
    except (ArgumentError, NoSuchModuleError) as exc:
        raise StoreError(f"store {shown}: not a usable SQLAlchemy URL ({exc}); expected e.g. "
                         f"sqlite:////abs/path/autospec.db or postgresql://user@host/db") from None
    if engine.dialect.name == "sqlite":
        _sqlite_settings(engine, busy_timeout_s)
    store = Store(engine, shown)
    try:
        # A read first: a store already at this version (the usual start) needs no write lock,
        # and a read-only store still opens for reading.
        with engine.connect() as connection, connection.begin():
            version = migrations.stored_version(connection)
        if migrations.check_version(shown, version):
            with engine.connect() as connection:
                with connection.execution_options(autospec_begin="BEGIN IMMEDIATE").begin():
                    migrations.create_or_migrate(connection, shown)
    except DBAPIError as exc:
        engine.dispose()
        raise StoreError(f"store {shown}: cannot open: "
                         f"{str(exc.orig or exc).strip().splitlines()[0]}") from exc
    except BaseException:
        engine.dispose()
        raise
    return store
