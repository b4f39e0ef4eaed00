"""[host] Databases the broker can query: named in ``databases.json``, connected by the host.

Each entry names the environment variable that holds the database's URL (the credential); the
kernel never sees it. Entries, per database, under ``"databases"`` or at the top level:
``"name": "ENV_VAR"`` or ``"name": {"url_env": "ENV_VAR", "read_only": true, "max_rows": 100000,
"max_bytes": 67108864}``. The file is read when the kernel starts (the config home's, then the
workspace's), so code cannot add a database to a running kernel's broker.

The workspace's file is the kernel's to write (in a fallback without the sandbox, by a shell line),
so it may only narrow: for a database the config home declares, it can make it read-only, lower its
caps and its timeout, nothing else; a database only the workspace names is always read-only, and
its SQLite file must be in the workspace. Whatever is ignored is said in one line.

Queries run through SQLAlchemy. ``read_only`` (the default) is enforced by the database itself
where the dialect lets a session say so (PostgreSQL: ``SET TRANSACTION READ ONLY``; SQLite:
``PRAGMA query_only``); for other dialects a read-only entry is refused rather than trusted.
A read-only query must also be one statement, or ``commit; insert ...`` would end the read-only
transaction and write: sqlite3 refuses several statements itself; on PostgreSQL the psycopg driver
prepares every statement (``prepare_threshold=0``), and the server refuses several in a prepared
one. Other PostgreSQL drivers send several statements as they are, so a read-only entry needs
``postgresql+psycopg://``.

SQLite files are the host's own files, so the host guards what a query can do with them: a file
opens only if it exists (``mode=ro`` for a read-only entry, ``mode=rw`` otherwise: never created),
only inside the workspace unless the entry comes from the config home's ``databases.json`` (a
workspace file is the kernel's to write, and a URL in ``.env`` is too), and an authorizer refuses
``ATTACH``, ``DETACH``, ``VACUUM INTO`` (it attaches its target) and ``load_extension``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import json
import os
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import sqlalchemy
from sqlalchemy.engine import Engine

from ivralo_kernel.host.broker.arrow_rows import ArrowRows
from ivralo_kernel.host.broker.vault import CredentialVault
from ivralo_kernel.protocol.credentials import config_home, database_entries

DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 64 << 20
DEFAULT_TIMEOUT_S = 60.0
FETCH_BATCH = 2_000
# A result with fewer rows and bytes than these goes as JSON even to a kernel that takes Arrow: cheaper
# there, and the kernel need not import pyarrow for it. Measured with `bench/hot_path_breakdown.py
# --sql --rows N --arrow-min-rows 0` against `--arrow-min-rows 1000000000` (JSON): 1,000 rows x 5
# columns 7.0 ms as JSON, 7.9 ms as Arrow; 3,000 rows 20-29 ms JSON, 11-21 ms Arrow. Text-heavy rows
# cross sooner: 98 KiB of text cost JSON 1.2 ms and Arrow 0.4 ms (host's and kernel's work, in process).
ARROW_MIN_ROWS = FETCH_BATCH  # a result past its first batch
ARROW_MIN_BYTES = 128 << 10
MAX_QUERY_CHARS = 100_000
MIN_VALUE_LIMIT = 1 << 20  # SQLite's limit on one value is never set below this (see _limit_value_size)
READ_ONLY_DIALECTS = ("postgresql", "sqlite")


class QueryRefused(Exception):
    """A query the host will not run, or one that failed; the message is safe to show."""


@dataclass(frozen=True)
class DatabaseEntry:
    name: str
    url_env: str
    read_only: bool = True
    max_rows: int = DEFAULT_MAX_ROWS
    max_bytes: int = DEFAULT_MAX_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S  # a query that runs longer is cancelled by the host
    from_config_home: bool = False  # declared by the person's config home (a SQLite file may be anywhere)


@dataclass(frozen=True)
class QueryAnswer:
    columns: list[str]
    rows: list[Sequence[Any]]  # already through the vault's redaction (each batch's JSON text searched)
    cut: str | None  # why the rows stop early, when they do
    rowcount: int | None = None  # rows a write changed
    table: Any = None  # a large result instead of rows: a pyarrow Table, redacted (arrow_rows)
    json_columns: list[int] = dataclasses.field(default_factory=list)  # the table's columns of JSON text


def load_databases(
    workspace: str, env: Mapping[str, str], include_workspace: bool = True
) -> tuple[dict[str, DatabaseEntry], list[str]]:
    specs, problems = database_entries(workspace, env, include_workspace)
    found: dict[str, DatabaseEntry] = {}
    home = os.path.realpath(config_home(env))
    for spec in specs:  # the config home's first; the workspace's may narrow them
        try:
            entry = _entry(spec.name, spec.spec)
            if os.path.realpath(spec.path.parent) == home:
                found[spec.name] = dataclasses.replace(entry, from_config_home=True)
            else:
                found[spec.name] = _narrowed(found.get(spec.name), entry, spec.spec, str(spec.path), problems)
        except (ValueError, TypeError) as exc:
            problems.append(f'{spec.path}: database "{spec.name}": {exc}')
    return found, problems


def _entry(name: str, spec: Any) -> DatabaseEntry:
    if not isinstance(spec, dict):
        raise ValueError('give the variable holding its URL as "url_env"')
    url_env = spec.get("url_env", spec.get("env"))
    if not isinstance(url_env, str) or not url_env:
        raise ValueError('field "url_env" must name the environment variable holding its URL')
    read_only, max_rows, max_bytes = (
        spec.get("read_only", True),
        spec.get("max_rows", DEFAULT_MAX_ROWS),
        spec.get("max_bytes", DEFAULT_MAX_BYTES),
    )
    if not isinstance(read_only, bool):
        raise ValueError('field "read_only" must be true or false')
    timeout_s = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise ValueError('field "timeout_s" must be a positive number of seconds')
    for field, value in (("max_rows", max_rows), ("max_bytes", max_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f'field "{field}" must be a positive integer')
    return DatabaseEntry(name, url_env, read_only, max_rows, max_bytes, float(timeout_s))


def _narrowed(
    declared: DatabaseEntry | None, entry: DatabaseEntry, spec: Any, where: str, problems: list[str]
) -> DatabaseEntry:
    """A workspace entry, as far as it may go: never wider than what the config home declared."""
    if declared is None or not declared.from_config_home:
        if not entry.read_only:
            problems.append(
                f'{where}: database "{entry.name}": "read_only": false is ignored: only the databases.json of the '
                "config home can declare a writable database (the workspace's file is the kernel's to write)"
            )
        return dataclasses.replace(entry, read_only=True, from_config_home=False)
    if entry.url_env != declared.url_env:
        problems.append(
            f'{where}: database "{entry.name}": ignored: the config home names it with {declared.url_env}, and '
            "the workspace's file may only narrow it (read_only, max_rows, max_bytes, timeout_s)"
        )
        return declared
    given = spec if isinstance(spec, dict) else {}
    return dataclasses.replace(
        declared,
        read_only=declared.read_only or ("read_only" in given and entry.read_only),
        max_rows=min(declared.max_rows, entry.max_rows) if "max_rows" in given else declared.max_rows,
        max_bytes=min(declared.max_bytes, entry.max_bytes) if "max_bytes" in given else declared.max_bytes,
        timeout_s=min(declared.timeout_s, entry.timeout_s) if "timeout_s" in given else declared.timeout_s,
    )


_PLAIN = frozenset({int, str, bool, type(None)})  # passed as they are; floats are checked (NaN is not JSON)
_SIZED = (str, bytes)  # values whose length counts toward a row's least JSON size (bytes: base64, more)


def _json_value(value: Any) -> Any:
    """A cell value as JSON can carry it (the kernel gets it over the Jupyter protocol)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


_FAST = _PLAIN | {float}  # a batch of only these is dumped as it is (allow_nan=False catches NaN)


def _as_json(batch: list[Sequence[Any]]) -> tuple[list[Sequence[Any]], str]:
    """The batch as JSON carries it, and its JSON text. One ``dumps`` when every value is plain (the
    usual case: a per-value conversion pass cost more than the query); otherwise value by value."""
    if {type(v) for row in batch for v in row} <= _FAST:
        try:
            return batch, json.dumps(batch, separators=(",", ":"), allow_nan=False)
        except ValueError:  # NaN or infinity: converted below, as any other value JSON cannot carry
            pass
    converted: list[Sequence[Any]] = [[v if type(v) in _PLAIN else _json_value(v) for v in row] for row in batch]
    return converted, json.dumps(converted, separators=(",", ":"))


def _add_sized(
    rows: list[Sequence[Any]], batch: list[Sequence[Any]], size: int, entry: DatabaseEntry, vault: CredentialVault
) -> tuple[int, str | None]:
    """Add ``batch`` to ``rows`` while their JSON stays under ``max_bytes``: (the size now, why they
    stop, or None). Each row added has been through the vault's redaction (its JSON text searched)."""
    batch, text = _as_json(batch)
    if size + len(text) <= entry.max_bytes:
        rows.extend(vault.redacted_dump(batch, text))
        return size + len(text), None
    for row in batch:  # find the row where the cap falls
        text = json.dumps(row, separators=(",", ":"))
        size += len(text) + 1
        if size > entry.max_bytes:
            break
        rows.append(vault.redacted_dump(row, text))
    return size, f"cut at {len(rows)} rows: {entry.max_bytes} bytes (max_bytes of {entry.name})"


def _limit_value_size(conn: Any, max_bytes: int) -> int:
    """SQLite refuses any string or blob larger than the cap (SQLITE_TOOBIG) before the host holds
    it: one ``zeroblob(200000000)`` would otherwise cost 200 MB here, whatever ``max_bytes`` says.
    At least 1 MiB, so the query's own text (MAX_SQL_CHARS) and its parameters still fit. Returns
    the limit it replaced, to be put back (the connection returns to the pool)."""
    raw: Any = conn.connection.driver_connection
    return int(raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max(max_bytes, MIN_VALUE_LIMIT)))


def _limit_time(conn: Any, dialect: str, timeout_s: float) -> None:
    """The database cancels a query that outlives ``timeout_s`` (a broker thread must not be held)."""
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL statement_timeout = {int(timeout_s * 1000)}")
    elif dialect == "sqlite":
        deadline = time.monotonic() + timeout_s
        conn.connection.driver_connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)


# sqlite3's authorizer action codes (the module exports only some of them by name).
_SQLITE_ATTACH, _SQLITE_DETACH, _SQLITE_FUNCTION = 24, 25, 31


def _sqlite_authorizer(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
    """No other file through a broker connection: ATTACH (VACUUM INTO attaches its target too),
    DETACH, and loading native code."""
    if action in (_SQLITE_ATTACH, _SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == _SQLITE_FUNCTION and (arg2 or "").lower() == "load_extension":
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def _harden_sqlite(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.set_authorizer(_sqlite_authorizer)


class Databases:
    def __init__(
        self, entries: Mapping[str, DatabaseEntry], vault: CredentialVault, workspace: str | None = None
    ) -> None:
        self.entries = dict(entries)
        self._vault = vault
        self._workspace = os.path.realpath(workspace) if workspace else None
        self._engines: dict[str, Engine] = {}

    def _sqlite_url(self, entry: DatabaseEntry, url: sqlalchemy.URL) -> sqlalchemy.URL:
        """An existing file, where this entry may point, opened read-only for a read-only entry."""
        database = url.database or ""
        if database in ("", ":memory:"):
            return url
        path = os.path.realpath(database)
        inside = self._workspace is not None and (path == self._workspace or path.startswith(self._workspace + os.sep))
        if not inside and not entry.from_config_home:
            raise QueryRefused(
                f'database "{entry.name}": the SQLite file of {entry.url_env} is outside the workspace; a file '
                "elsewhere must be declared in the databases.json of the config home, not the workspace's"
            )
        if not os.path.isfile(path):
            raise QueryRefused(
                f'database "{entry.name}": the SQLite file of {entry.url_env} does not exist (the broker opens '
                "existing files only; create it first)"
            )
        mode = "ro" if entry.read_only else "rw"
        return sqlalchemy.URL.create(
            url.drivername, database=f"file:{quote(path)}?mode={mode}", query={**url.query, "uri": "true"}
        )

    def _engine(self, entry: DatabaseEntry) -> Engine:
        engine = self._engines.get(entry.name)
        if engine is not None:
            return engine
        url_text = self._vault.get(entry.url_env)
        if not url_text:
            raise QueryRefused(
                f'database "{entry.name}": the host has no value for {entry.url_env} (set it in the environment '
                "that starts JupyterLab or the agent, or in the workspace's .env)"
            )
        try:
            url = sqlalchemy.make_url(url_text)
        except sqlalchemy.exc.ArgumentError:
            raise QueryRefused(f'database "{entry.name}": {entry.url_env} does not hold a database URL') from None
        if url.password:
            self._vault.also_redact(entry.url_env, str(url.password))
        if entry.read_only and url.get_backend_name() not in READ_ONLY_DIALECTS:
            raise QueryRefused(
                f'database "{entry.name}": read_only is enforced only for {", ".join(READ_ONLY_DIALECTS)}; give '
                'it a read-only database role and set "read_only": false in databases.json'
            )
        connect_args: dict[str, Any] = {}
        if url.get_backend_name() == "sqlite":
            url = self._sqlite_url(entry, url)
        if entry.read_only and url.get_backend_name() == "postgresql":
            if url.get_driver_name() != "psycopg":
                raise QueryRefused(
                    f'database "{entry.name}": read_only on PostgreSQL is enforced with the psycopg driver only; '
                    f"write {entry.url_env} as postgresql+psycopg://... (pip install 'psycopg[binary]')"
                )
            connect_args["prepare_threshold"] = 0  # one statement per query (see the module's docstring)
        try:
            engine = sqlalchemy.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
        except Exception as exc:  # noqa: BLE001 - a missing driver or a bad option: say so, redacted
            raise QueryRefused(self._vault.redact(f'database "{entry.name}": {type(exc).__name__}: {exc}')) from None
        if engine.dialect.name == "sqlite":
            sqlalchemy.event.listen(engine, "connect", _harden_sqlite)
        self._engines[entry.name] = engine
        return engine

    def query(self, name: str, sql: str, params: Mapping[str, Any], arrow: Any = None) -> QueryAnswer:
        """The query's answer; ``arrow`` (pyarrow), when a large result may come as an Arrow table."""
        entry = self.entries[name]
        engine = self._engine(entry)
        try:
            with engine.connect() as conn:
                dialect = engine.dialect.name
                if entry.read_only and dialect == "sqlite":
                    conn.exec_driver_sql("PRAGMA query_only = ON")
                elif entry.read_only and dialect == "postgresql":
                    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                _limit_time(conn, dialect, entry.timeout_s)
                value_limit = _limit_value_size(conn, entry.max_bytes) if dialect == "sqlite" else None
                try:
                    answer = self._run(conn, entry, sql, params, arrow)
                finally:
                    if dialect == "sqlite":
                        raw: Any = conn.connection.driver_connection
                        raw.set_progress_handler(None, 0)
                        raw.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, value_limit)
                    if entry.read_only and dialect == "sqlite":
                        conn.rollback()
                        conn.exec_driver_sql("PRAGMA query_only = OFF")
                if entry.read_only:
                    conn.rollback()
                else:
                    conn.commit()
                return answer
        except sqlalchemy.exc.SQLAlchemyError as exc:
            detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            if detail in ("interrupted", "canceling statement due to statement timeout"):
                detail = f"the query ran longer than {entry.timeout_s:g} s (timeout_s of {name} in databases.json)"
            elif engine.dialect.name == "sqlite" and detail in ("not authorized", "authorization denied"):
                detail += " (the broker refuses ATTACH, DETACH, VACUUM INTO and load_extension: a query "
                detail += "reaches this database's file only)"
            elif engine.dialect.name == "sqlite" and detail == "string or blob too big":
                detail += (
                    f" (a value of the result, or made on the way, is larger than max_bytes of {name}, "
                    f"{max(entry.max_bytes, MIN_VALUE_LIMIT)} bytes: the broker never holds more. Select a part "
                    "of it, e.g. substr(...), or ask the person to raise max_bytes in the config home's "
                    "databases.json)"
                )
            elif entry.read_only and ("readonly" in detail or "read-only" in detail):
                detail += f" ({name} is read_only in databases.json)"
            raise QueryRefused(self._vault.redact(f'database "{name}": {type(exc).__name__}: {detail}')) from None

    def _run(self, conn: Any, entry: DatabaseEntry, sql: str, params: Mapping[str, Any], arrow: Any) -> QueryAnswer:
        """The rows, fetched one at a time and counted against ``max_bytes`` as they come: the host never
        holds more than the cap and the one row that crosses it (a batch fetched first and measured after
        once took 2.4 GiB under a 64 MiB cap). On SQLite a single value larger than the cap is refused by
        SQLite itself before it reaches Python (``_limit_value_size``).

        ``arrow``: pyarrow, when the kernel takes an Arrow answer; a result that reaches
        ``ARROW_MIN_ROWS`` or ``ARROW_MIN_BYTES`` is then built as an Arrow table (``arrow_rows``), the
        rows kept so far included; a smaller one stays JSON (cheaper below that, and the kernel need
        not import pyarrow). Arrow counts its own bytes against ``max_bytes`` (``arrow_rows``)."""
        result = conn.execute(sqlalchemy.text(sql), dict(params))
        if not result.returns_rows:
            return QueryAnswer([], [], None, result.rowcount)
        columns = list(result.keys())
        rows: list[Sequence[Any]] = []
        table: ArrowRows | None = None
        pending: list[Sequence[Any]] = []  # fetched, not yet sized exactly (one dumps per row costs too much)
        size, least = 0, 0  # least: a lower bound of the pending rows' size (JSON's, or Arrow's)
        cut: str | None = None

        def add_pending() -> str | None:
            """The pending rows kept, as JSON or Arrow (from the batch where the result turns large):
            why the rows stop here, or None."""
            nonlocal rows, size, table
            if table is None and arrow is not None:
                if len(rows) + len(pending) >= ARROW_MIN_ROWS or size + least >= ARROW_MIN_BYTES:
                    table = ArrowRows(arrow, len(columns), entry.max_bytes, self._vault, _json_value, QueryRefused)
                    kept, rows = rows, []
                    if not table.add(kept):  # already as JSON carries them, and redacted (again: no harm)
                        return f"cut at {table.count} rows: {entry.max_bytes} bytes (max_bytes of {entry.name})"
            if table is None:
                size, cut = _add_sized(rows, pending, size, entry, self._vault)
                return cut
            fits = table.add(pending)
            size = table.size
            return None if fits else f"cut at {table.count} rows: {entry.max_bytes} bytes (max_bytes of {entry.name})"

        sized, append, fetched = _SIZED, pending.append, 0
        try:
            # The driver's own cursor: a text() query has no result types for SQLAlchemy to apply, and
            # its Row objects cost twice the fetch. Still one row at a time (the cap, above).
            for row in result.cursor:
                fetched += 1
                if fetched > entry.max_rows:
                    cut = f"cut at {entry.max_rows} rows (max_rows of {entry.name} in databases.json)"
                    break
                append(row)
                least += len(row)
                for value in row:  # a loop, not a generator per row: a third of the fetch's time saved
                    if type(value) in sized:
                        least += len(value)
                if len(pending) >= FETCH_BATCH or size + least > entry.max_bytes:
                    cut = add_pending()
                    pending.clear()
                    least = 0
                    if cut is not None:
                        break
            if pending:
                cut = add_pending() or cut
        finally:
            result.close()
        if table is not None:
            arrow_table, json_columns = table.table()
            return QueryAnswer(columns, [], cut, table=arrow_table, json_columns=json_columns)
        return QueryAnswer(columns, rows, cut)

    def close(self) -> None:
        for engine in self._engines.values():
            engine.dispose()
        self._engines.clear()
