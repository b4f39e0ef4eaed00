"""SQL through the credential broker: ``ivralo.sql`` in a real kernel, answered by the host, on a
SQLite file in the workspace and on a real PostgreSQL server whose role logs in with a password.

What is checked: rows as dicts, ``dataframe=True``, named parameters, read-only by default (the
database refuses a write) and ``"read_only": false``, the record line after the output (it names
the variable, never the URL), unknown database names, the "databases" grant, the ``max_rows`` cut
and its warning, and that no URL or password reaches the kernel: not its output, not its errors
(a failing query, a wrong password), not ``os.environ`` nor ``/proc/self/environ``, not the host's
log. Few kernels are started: each test groups its checks into the cells of one session.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy

from ivralo_kernel.cli import main
from ivralo_kernel.host import Session, WorkerConfig

RECORD = r"\[ivralo answered this code's calls: {what} with {var} \(1 call, \d+\.\ds\)\]\n"
ITEMS = [("apple", 0.5), ("bread", 2.25), ("cheese", 7.0), ("dates", 3.5), ("eggs", 2.75)]


def text_of(result: str | dict[str, str]) -> str:
    """Everything a cell's caller sees: its output, or the error dict's fields."""
    return result if isinstance(result, str) else "\n".join(result.values())


def ok(result: str | dict[str, str]) -> str:
    assert isinstance(result, str), result
    return result


def failed(result: str | dict[str, str]) -> str:
    assert isinstance(result, dict), result
    return result["error"]


def write_databases(workspace: Path, databases: dict[str, Any]) -> None:
    (workspace / "databases.json").write_text(json.dumps(databases))


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own config home: a writable database can be declared only there."""
    home = tmp_path / "config-home"
    home.mkdir()
    monkeypatch.setenv("IVRALO_CONFIG_HOME", str(home))
    return home


ENV_CHECK = """
import os
names = {names!r}
print(sorted(k for k in os.environ if k in names))
print(any(s in v for v in os.environ.values() for s in {secrets!r}))
environ = open("/proc/self/environ", "rb").read()
print(any(n.encode() + b"=" in environ or s.encode() in environ for n in names for s in {secrets!r}))
"""


# --------------------------------------------------------------------------- SQLite


def make_shop(path: Path) -> Path:
    """A small SQLite shop: the ITEMS table."""
    with sqlite3.connect(path) as db:
        db.execute("create table items (id integer primary key, name text not null, price real not null)")
        db.executemany("insert into items (name, price) values (?, ?)", ITEMS)
    db.close()
    return path


@pytest.fixture
def shop(workspace: Path, config_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A SQLite file in the workspace, named in the workspace's databases.json (read-only entries) and
    the config home's (the writable one); its URL in the host's env."""
    path = make_shop(workspace / "shop.sqlite")
    monkeypatch.setenv("SHOP_DB_URL", f"sqlite:///{path}")
    write_databases(config_home, {"shop_rw": {"url_env": "SHOP_DB_URL", "read_only": False}})
    write_databases(
        workspace,
        {
            "shop": "SHOP_DB_URL",  # the short form: read-only, default caps
            "shop_capped": {"url_env": "SHOP_DB_URL", "max_rows": 3},
            "shop_quick": {"url_env": "SHOP_DB_URL", "timeout_s": 0.3},
        },
    )
    return path


def count_items(path: Path) -> int:
    with sqlite3.connect(path) as db:
        (n,) = db.execute("select count(*) from items").fetchone()
    db.close()
    return int(n)


async def test_sqlite_through_the_broker(workspace: Path, shop: Path) -> None:
    url = f"sqlite:///{shop}"
    seen: list[str] = []
    async with Session(workspace=workspace, grants=("databases",)) as session:

        async def run(code: str) -> str | dict[str, str]:
            result = await session.run(code)
            seen.append(text_of(result))
            return result

        # Rows as dicts, a named parameter; the record line names the variable.
        out = ok(
            await run('print(ivralo.sql("shop", "select * from items where price < :cap order by id", {"cap": 3}))')
        )
        rows = "[{'id': 1, 'name': 'apple', 'price': 0.5}, {'id': 2, 'name': 'bread', 'price': 2.25}, "
        rows += "{'id': 5, 'name': 'eggs', 'price': 2.75}]\n"
        assert re.fullmatch(re.escape(rows) + RECORD.format(what="shop database", var="SHOP_DB_URL"), out), out

        # A DataFrame.
        out = ok(
            await run(
                'df = ivralo.sql("shop", "select name, price from items order by id", dataframe=True)\n'
                'print(type(df).__name__, df.shape, list(df.columns), df["price"].dtype, df["name"].iloc[-1])'
            )
        )
        assert out.startswith("DataFrame (5, 2) ['name', 'price'] float64 eggs\n[ivralo answered"), out

        # Read-only by default: SQLite itself refuses the write, and the file is unchanged.
        error = failed(await run('ivralo.sql("shop", "insert into items (name, price) values (\'x\', 1)")'))
        assert 'BrokerError: database "shop": OperationalError: attempt to write a readonly database' in error
        assert count_items(shop) == len(ITEMS)
        # Nor can a second statement undo the read-only mode first: one statement per query.
        error = failed(
            await run("ivralo.sql('shop', \"pragma query_only = off; insert into items values (9, 'x', 1)\")")
        )
        assert "ProgrammingError: You can only execute one statement at a time." in error
        assert count_items(shop) == len(ITEMS)

        # "read_only": false: the write is committed (seen by the host, and by the read-only entry).
        out = ok(
            await run(
                'print(ivralo.sql("shop_rw", "insert into items (name, price) values (:name, :price)", '
                '{"name": "figs", "price": 4.5}))\n'
                'print(ivralo.sql("shop", "select name from items where price = :p", {"p": 4.5}))'
            )
        )
        assert out.startswith("{'rowcount': 1}\n[{'name': 'figs'}]\n[ivralo answered this code's calls: "), out
        assert "shop_rw database with SHOP_DB_URL (1 call" in out and "shop database with SHOP_DB_URL (1 call" in out
        assert count_items(shop) == len(ITEMS) + 1

        # A name databases.json does not have: refused (a PermissionError), naming the known ones.
        out = ok(
            await run(
                'try:\n    ivralo.sql("shops", "select 1")\n'
                "except PermissionError as e:\n    print(type(e).__name__, e)"
            )
        )
        known = "shop, shop_capped, shop_quick, shop_rw"
        assert out == f"BrokerRefused unknown database 'shops' (this host knows: {known})\n"

        # max_rows: the rows are cut, with a warning saying where the cap comes from.
        out = ok(
            await run(
                "import warnings\nwith warnings.catch_warnings(record=True) as caught:\n"
                '    warnings.simplefilter("always")\n'
                '    rows = ivralo.sql("shop_capped", "select id from items order by id")\n'
                "print(rows, [(w.category.__name__, str(w.message)) for w in caught])"
            )
        )
        assert out.startswith(
            "[{'id': 1}, {'id': 2}, {'id': 3}] [('UserWarning', 'ivralo: the result of the query on shop_capped "
            "was cut at 3 rows (max_rows of shop_capped in databases.json)')]\n"
        ), out

        # The kernel never had the URL: not in os.environ, not in its initial environment.
        out = ok(await run(ENV_CHECK.format(names=["SHOP_DB_URL"], secrets=[url, "shop.sqlite"])))
        assert out == "[]\nFalse\nFalse\n"
        out = ok(await run("print(ivralo.databases())"))
        assert out == "{'shop': 'read-only (granted)', 'shop_capped': 'read-only (granted)', " \
            "'shop_quick': 'read-only (granted)', 'shop_rw': 'read-write (granted)'}\n"  # fmt: skip

        # A query past its timeout_s is cancelled by the database; a broker thread is not held.
        endless = "with recursive r(i) as (select 1 union all select i + 1 from r) select count(*) from r"
        error = failed(await run(f"ivralo.sql('shop_quick', {endless!r})"))
        assert (
            'BrokerError: database "shop_quick": OperationalError: the query ran longer than 0.3 s '
            "(timeout_s of shop_quick in databases.json)" in error
        ), error

    assert not [text for text in seen if url in text]


def reset_peak_rss() -> None:
    """The host's (this process's) peak RSS starts again from its current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    match = re.search(r"^VmHWM:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match, "no VmHWM in /proc/self/status"
    return int(match.group(1)) * 1024


async def test_the_broker_caps_bytes_while_it_fetches(workspace: Path, shop: Path) -> None:
    """Rows far larger than max_bytes never reach the host's memory: a value larger than the cap is
    refused by SQLite before the host holds it (five zeroblob(200000000) rows, 1 GB in all, once cost
    the host 2.4 GiB under a 64 MiB cap), and many rows each under the cap are cut as they come, not
    after a whole batch is built. Judged by the host's own peak RSS (this process runs the broker)."""
    five = "with r(i) as (values (1), (2), (3), (4), (5)) select i, zeroblob(200000000) as b from r"
    hundred = "with recursive r(i) as (select 1 union all select i + 1 from r where i < 100) "
    hundred += "select i, zeroblob(8000000) as b from r"
    write_databases(workspace, {"shop": "SHOP_DB_URL", "shop_small": {"url_env": "SHOP_DB_URL", "max_bytes": 16 << 20}})
    async with Session(workspace=workspace, grants=("databases",)) as session:
        ok(await session.run("import warnings"))  # the kernel warmed up before the host's peak is reset
        reset_peak_rss()
        before = peak_rss_bytes()
        error = failed(await session.run(f"ivralo.sql('shop', {five!r})"))
        grown = peak_rss_bytes() - before
        assert "string or blob too big" in error and "larger than max_bytes of shop, 67108864 bytes" in error, error
        assert "substr" in error, error
        assert grown < 100 << 20, f"the host's peak RSS grew by {grown >> 20} MiB for 1 GB of blobs"

        reset_peak_rss()
        before = peak_rss_bytes()
        out = ok(
            await session.run(
                "with warnings.catch_warnings(record=True) as caught:\n"
                '    warnings.simplefilter("always")\n'
                f"    rows = ivralo.sql('shop_small', {hundred!r})\n"
                "print(len(rows), [str(w.message) for w in caught])"
            )
        )
        grown = peak_rss_bytes() - before
        assert out.startswith(
            "1 ['ivralo: the result of the query on shop_small was cut at 1 rows: 16777216 bytes (max_bytes of "
            "shop_small)']\n"
        ), out
        assert grown < 200 << 20, f"the host's peak RSS grew by {grown >> 20} MiB for 800 MB of blobs"


async def test_a_query_reaches_no_other_file(workspace: Path, shop: Path, tmp_path: Path) -> None:
    """ATTACH (which creates its file), VACUUM INTO and load_extension are refused by the host's
    authorizer, on a read-write entry too; judged by the files on disk and the row count."""
    outside = tmp_path / "outside"
    outside.mkdir()
    tries = {
        "attach": f"attach database '{outside / 'attached.db'}' as a",
        "vacuum": f"vacuum into '{outside / 'copy.db'}'",
        "extension": "select load_extension('/nonexistent/lib.so')",
        "insert via attach": f"attach database '{workspace / 'sneaky.db'}' as b",
    }
    async with Session(workspace=workspace, grants=("databases",)) as session:
        for what, sql in tries.items():
            error = failed(await session.run(f'ivralo.sql("shop_rw", {sql!r})'))
            assert "not authorized" in error or "authorization denied" in error, (what, error)
    assert sorted(p.name for p in outside.iterdir()) == []
    assert not (workspace / "sneaky.db").exists()
    assert count_items(shop) == len(ITEMS)


async def test_a_sqlite_file_is_opened_only_where_the_entry_may_point(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL added to .env by code (EVIL_DB_URL) that points outside the workspace is refused: no
    file appears there. A file that does not exist is never created, inside either."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".env").write_text(f"EVIL_DB_URL=sqlite:///{outside / 'made.db'}\n")
    monkeypatch.setenv("MISSING_DB_URL", f"sqlite:///{workspace / 'missing.db'}")
    write_databases(workspace, {"evil": {"url_env": "EVIL_DB_URL", "read_only": False}, "missing": "MISSING_DB_URL"})
    async with Session(workspace=workspace, grants=("databases",)) as session:
        error = failed(await session.run('ivralo.sql("evil", "create table t (x)")'))
        assert "outside the workspace" in error and "config home" in error, error
        error = failed(await session.run('ivralo.sql("missing", "select 1")'))
        assert "does not exist" in error, error
    assert list(outside.iterdir()) == []
    assert not (workspace / "missing.db").exists()


async def test_code_cannot_make_a_read_only_database_writable(
    workspace: Path, config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the sandbox a shell line rewrites the workspace's databases.json ("read_only": false);
    the next worker still cannot write: the workspace's file only narrows the config home's.
    Judged by the row count."""
    shop = make_shop(workspace / "shop.sqlite")
    monkeypatch.setenv("SHOP_DB_URL", f"sqlite:///{shop}")
    write_databases(config_home, {"shop": {"url_env": "SHOP_DB_URL", "read_only": True}})
    widened = json.dumps({"shop": {"url_env": "SHOP_DB_URL", "read_only": False}, "extra": "SHOP_DB_URL"})
    fallback = WorkerConfig(sandbox="off")
    async with Session(workspace=workspace, grants=("databases",), config=fallback) as session:
        script = f"echo {shlex.quote(widened)} > databases.json"
        await session.run(f"import subprocess\nsubprocess.run(['sh', '-c', {script!r}])")
    assert json.loads((workspace / "databases.json").read_text())["shop"]["read_only"] is False
    insert = "insert into items (name, price) values ('x', 1)"
    async with Session(workspace=workspace, grants=("databases",), config=fallback) as session:
        # Changed while a kernel ran: the host sets the whole file aside until the person approves it.
        error = failed(await session.run(f"ivralo.sql('extra', {insert!r})"))
        assert "unknown database 'extra'" in error, error
        error = failed(await session.run(f"ivralo.sql('shop', {insert!r})"))
        assert "readonly" in error or "read-only" in error, error
    assert main(["trust", str(workspace)]) == 0
    async with Session(workspace=workspace, grants=("databases",), config=fallback) as session:
        # Approved, it still only narrows: both entries are read-only.
        for name in ("shop", "extra"):
            error = failed(await session.run(f"ivralo.sql({name!r}, {insert!r})"))
            assert "readonly" in error or "read-only" in error, error
    assert count_items(shop) == len(ITEMS)


async def test_sqlite_without_the_databases_grant_is_refused(workspace: Path, shop: Path) -> None:
    async with Session(workspace=workspace) as session:  # no grants
        out = ok(
            await session.run(
                'try:\n    ivralo.sql("shop", "select * from items")\n'
                "except PermissionError as e:\n    print(type(e).__name__, e)\n"
                "print(ivralo.databases())"
            )
        )
        error = failed(await session.run('ivralo.sql("shop", "select 1")'))
    assert out.startswith('BrokerRefused refused: this kernel has no "databases" grant\n'), out
    assert "'shop': 'read-only (needs the \"databases\" grant)'" in out
    assert "[ivralo answered" not in out  # the host made no call
    assert 'BrokerRefused: refused: this kernel has no "databases" grant' in error


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_items(pg_url: str) -> str:
    """Fresh ``items`` and ``notes`` tables in the test database, made by the host."""
    engine = sqlalchemy.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("drop table if exists items")
            conn.exec_driver_sql("create table items (id serial primary key, name text not null, price numeric(6,2))")
            conn.execute(
                sqlalchemy.text("insert into items (name, price) values (:name, :price)"),
                [{"name": n, "price": p} for n, p in ITEMS],
            )
            # A row that holds the credential itself (a config table, say): the host redacts it.
            password = sqlalchemy.make_url(pg_url).password
            conn.exec_driver_sql("drop table if exists notes")
            conn.exec_driver_sql("create table notes (body text)")
            conn.execute(sqlalchemy.text("insert into notes values (:b)"), {"b": f"url={pg_url} pw={password}"})
    finally:
        engine.dispose()
    return "items"


def pg_count(pg_url: str) -> int:
    engine = sqlalchemy.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            return int(conn.exec_driver_sql("select count(*) from items").scalar_one())
    finally:
        engine.dispose()


async def test_postgres_with_a_password_through_the_broker(
    workspace: Path,
    config_home: Path,
    pg_url: str,
    pg_items: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = sqlalchemy.make_url(pg_url)
    password = str(url.password)
    wrong_password = password[::-1] + "-wrong"
    wrong_url = url.set(password=wrong_password).render_as_string(hide_password=False)
    v2_url = url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    secrets = [password, wrong_password, pg_url, wrong_url, v2_url]
    monkeypatch.setenv("PG_DB_URL", pg_url)
    monkeypatch.setenv("PG_V2_URL", v2_url)
    monkeypatch.setenv("PG_BAD_URL", wrong_url)
    (workspace / ".env").write_text(f"PG_DOTENV_URL={pg_url}\n")  # the workspace .env counts for the host too
    write_databases(config_home, {"pg_rw": {"url_env": "PG_DB_URL", "read_only": False}})
    write_databases(
        workspace,
        {
            "databases": {
                "pg": {"url_env": "PG_DB_URL"},
                "pg_bad": {"url_env": "PG_BAD_URL"},
                "pg_dotenv": "PG_DOTENV_URL",
                "pg_v2": "PG_V2_URL",
            }
        },
    )
    seen: list[str] = []
    async with Session(workspace=workspace, grants=("databases",)) as session:

        async def run(code: str) -> str | dict[str, str]:
            result = await session.run(code)
            seen.append(text_of(result))
            return result

        # Rows as dicts (numeric comes back as a float), a named parameter; the record line.
        out = ok(
            await run(
                'print(ivralo.sql("pg", "select name, price from items where price < :cap order by id", {"cap": 3}))'
            )
        )
        rows = "[{'name': 'apple', 'price': 0.5}, {'name': 'bread', 'price': 2.25}, {'name': 'eggs', 'price': 2.75}]\n"
        assert re.fullmatch(re.escape(rows) + RECORD.format(what="pg database", var="PG_DB_URL"), out), out

        # A DataFrame; the role and address the host used (scram over TCP on 127.0.0.1).
        out = ok(
            await run(
                'df = ivralo.sql("pg", "select * from items order by id", dataframe=True)\n'
                "print(df.shape, list(df.columns), df['price'].sum())\n"
                'print(ivralo.sql("pg_dotenv", "select current_user as who, host(inet_server_addr()) as addr"))'
            )
        )
        assert out.startswith("(5, 3) ['id', 'name', 'price'] 16.0\n[{'who': 'app', 'addr': '127.0.0.1'}]\n"), out
        assert "pg database with PG_DB_URL (1 call" in out and "pg_dotenv database with PG_DOTENV_URL (1 call" in out

        # Read-only by default: PostgreSQL refuses the write in a read-only transaction.
        error = failed(await run("ivralo.sql('pg', \"insert into items (name, price) values ('x', 1)\")"))
        assert 'BrokerError: database "pg": InternalError: cannot execute INSERT in a read-only transaction' in error
        assert pg_count(pg_url) == len(ITEMS)
        # Nor after ending the read-only transaction first: a read-only query is one statement.
        for first in ("commit", "rollback", "select 1"):
            error = failed(await run(f"ivralo.sql('pg', \"{first}; insert into items (name, price) values ('x', 1)\")"))
            assert "ProgrammingError: cannot insert multiple commands into a prepared statement" in error
        assert pg_count(pg_url) == len(ITEMS)
        # A driver that sends several statements as they are (psycopg2; the default of postgresql://
        # before SQLAlchemy 2.1) cannot be trusted with read_only: refused before connecting.
        error = failed(await run('ivralo.sql("pg_v2", "select 1")'))
        assert 'BrokerError: database "pg_v2": read_only on PostgreSQL is enforced with the psycopg driver only; ' \
            "write PG_V2_URL as postgresql+psycopg://..." in error  # fmt: skip

        # "read_only": false commits.
        out = ok(
            await run(
                'print(ivralo.sql("pg_rw", "insert into items (name, price) values (:n, :p)", {"n": "figs", "p": 4.5}))'
            )
        )
        assert out.startswith("{'rowcount': 1}\n[ivralo answered this code's calls: pg_rw database with PG_DB_URL"), out
        assert pg_count(pg_url) == len(ITEMS) + 1

        # A failing query: the database's own message, nothing of the URL.
        error = failed(await run('ivralo.sql("pg", "select * from no_such_table")'))
        assert 'BrokerError: database "pg": ProgrammingError: relation "no_such_table" does not exist' in error

        # A URL with a wrong password: the login fails, and neither password is in the message.
        error = failed(await run('ivralo.sql("pg_bad", "select 1")'))
        assert 'BrokerError: database "pg_bad": OperationalError: ' in error
        assert 'password authentication failed for user "app"' in error

        # A row holding the URL and the password comes back with their names in their place.
        out = ok(await run('print(ivralo.sql("pg", "select body from notes"))'))
        assert re.match(r"\[\{'body': 'url=<PG_[A-Z_]*URL> pw=<PG_[A-Z_]*URL>'\}\]\n", out), out
        # So does a large result (Arrow through the exchange folder), and numeric and timestamptz come as
        # a float and ISO text there too.
        big = "select i, i::numeric / 4 as q, now() as t, n.body from generate_series(1, 3000) i, notes n"
        out = ok(await run(f"rows = ivralo.sql('pg', {big!r})\nprint(len(rows), rows[0]['q'], rows[-1])"))
        last = r"\{'i': 3000, 'q': 750.0, 't': '20\d\d-.*', 'body': 'url=<PG_[A-Z_]*URL> pw=<PG_[A-Z_]*URL>'\}"
        assert re.match(r"3000 0.25 " + last, out), out

        # An unknown database name (a typo).
        error = failed(await run('ivralo.sql("pgg", "select 1")'))
        assert "BrokerRefused: unknown database 'pgg' (this host knows: pg, pg_bad, pg_dotenv, pg_rw, pg_v2)" in error

        # The kernel never had a URL or a password: not in os.environ, not in /proc/self/environ.
        names = ["PG_DB_URL", "PG_BAD_URL", "PG_DOTENV_URL", "PG_V2_URL"]
        out = ok(await run(ENV_CHECK.format(names=names, secrets=[password, wrong_password])))
        assert out == "[]\nFalse\nFalse\n"

    leaks = [(secret, text) for text in seen for secret in secrets if secret in text]
    assert not leaks, leaks
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert not [secret for secret in secrets if secret in logged], "a URL or password reached the host's log"
