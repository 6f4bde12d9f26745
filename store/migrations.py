"""Schema versions: check the stored one at start, migrate older stores forward in order.

A fresh database gets the current tables directly (`Base.metadata.create_all`) and is stamped
with `schema.SCHEMA_VERSION`. An older store runs `MIGRATIONS` from its version up, one step
at a time, each stamping the version it reached, all in the opening transaction (SQLite and
PostgreSQL both roll DDL back, so a failed migration leaves the old schema intact). A store
newer than this code is refused: guessing at a future schema could lose data.
"""
from __future__ import annotations

from typing import Callable

from sqlalchemy import Connection, inspect, select, text

import autospec.store.schema as schema
from autospec.store.errors import StoreSchemaError

Migration = Callable[[Connection], None]


def _v1_to_v2(connection: Connection) -> None:
    """Two quantities, two names: the learnt P(accepted | earlier accepted) is
    `conditional_acceptance` (`acceptance_per_position` stays the telemetry's P(accepted |
    proposed)); the controller's time per step is `controller_seconds`."""
    for table, old, new in (("estimates", "acceptance_per_position", "conditional_acceptance"),
                            ("requests", "policy_seconds", "controller_seconds")):
        connection.execute(text(f"ALTER TABLE {schema.TABLE_PREFIX}{table} "
                                f"RENAME COLUMN {old} TO {new}"))


def _v2_to_v3(connection: Connection) -> None:
    """A new table, batch_costs: made by create_or_migrate's closing create_all (nothing in
    the old tables changes)."""


def _v3_to_v4(connection: Connection) -> None:
    """estimates and batch_costs gain `instance` (the daemon that learnt the row) in their
    unique key, so daemons sharing a store stop overwriting each other. SQLite cannot change
    a table's constraints in place: each table is rebuilt (renamed, created anew, copied, the
    old one dropped); the old rows become instance "" (a lone daemon's)."""
    for table in (schema.EstimateRow.__table__, schema.BatchCostRow.__table__):
        if not inspect(connection).has_table(table.name):
            continue  # batch_costs, from a v2 store: create_or_migrate's create_all makes it
        old = f"{table.name}_v3"
        columns = ", ".join(c.name for c in table.columns if c.name not in ("id", "instance"))
        connection.execute(text(f"ALTER TABLE {table.name} RENAME TO {old}"))
        table.create(connection)
        connection.execute(text(f"INSERT INTO {table.name} ({columns}, instance) "
                                f"SELECT {columns}, '' FROM {old}"))
        connection.execute(text(f"DROP TABLE {old}"))


def _v4_to_v5(connection: Connection) -> None:
    """requests gain `method` (what each request ran with: plain, adaptive, ...), nullable:
    the rows already there keep NULL, "not said"."""
    column = schema.RequestRow.__table__.c.method
    connection.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN {column.name} "
                            f"{column.type.compile(connection.dialect)}"))


def _v5_to_v6(connection: Connection) -> None:
    """estimates gain `calibration` (each drafter's confidence -> P(accepted) map), nullable:
    the rows already there keep NULL, none learnt. (A store from before v4 has it already:
    v3 -> v4 rebuilt the table as it is now.)"""
    column = schema.EstimateRow.__table__.c.calibration
    if column.name in {c["name"] for c in inspect(connection).get_columns(column.table.name)}:
        return
    connection.execute(text(f"ALTER TABLE {column.table.name} ADD COLUMN {column.name} "
                            f"{column.type.compile(connection.dialect)}"))


# (from_version, upgrade): upgrade(connection) turns a store at from_version into one at
# from_version + 1. Ordered.
MIGRATIONS: list[tuple[int, Migration]] = [(1, _v1_to_v2), (2, _v2_to_v3), (3, _v3_to_v4),
                                           (4, _v4_to_v5), (5, _v5_to_v6)]


def stored_version(connection: Connection) -> int | None:
    """The store's schema version, or None for a database without our tables yet."""
    if not inspect(connection).has_table(schema.SchemaVersionRow.__tablename__):
        return None
    row = connection.execute(select(schema.SchemaVersionRow.version)
                             .where(schema.SchemaVersionRow.id == 1)).first()
    return None if row is None else int(row[0])


def stamp(connection: Connection, version: int) -> None:
    table = schema.SchemaVersionRow.__table__
    values = {"version": version, "updated_at": schema.utc_now()}
    if connection.execute(table.update().where(table.c.id == 1).values(**values)).rowcount == 0:
        connection.execute(table.insert().values(id=1, **values))


def check_version(url: str, version: int | None) -> bool:
    """True when the store needs creating or migrating; raises if it is newer than the code."""
    current = schema.SCHEMA_VERSION
    if version is not None and version > current:
        raise StoreSchemaError(
            f"store {url}: schema version {version} is newer than this autospec's "
            f"{current}; upgrade autospec, or use another store (--store URL)")
    return version != current


def create_or_migrate(connection: Connection, url: str) -> int | None:
    """Bring the store to schema.SCHEMA_VERSION; returns the version it started from."""
    version = stored_version(connection)  # re-read under the write lock: another process
    if not check_version(url, version):   # may have created or migrated it meanwhile
        return version
    if version is None:
        schema.Base.metadata.create_all(connection)
        stamp(connection, schema.SCHEMA_VERSION)
        return None
    steps = dict(MIGRATIONS)
    for v in range(version, schema.SCHEMA_VERSION):
        if v not in steps:
            raise StoreSchemaError(f"store {url}: no migration from schema version {v} to "
                                   f"{v + 1} (have: {sorted(steps) or 'none'})")
        steps[v](connection)
        stamp(connection, v + 1)
    # tables added since (a migration may leave new tables to this): create what is missing
    schema.Base.metadata.create_all(connection)
    return version
