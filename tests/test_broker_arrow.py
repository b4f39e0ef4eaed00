"""Large SQL results as Arrow through the exchange folder (host/broker/arrow_rows.py,
result_segments.py; kernel/broker_rows.py).

Host side, no process: the values an Arrow answer gives the kernel are the JSON answer's (dicts and
DataFrame alike, odd types and mixed columns included), a credential inside any string value is
redacted, one written as a number is refused, max_bytes cuts where it says, and a segment is
written only in the folder the host opened, whatever was put at its path since.

Through a real kernel (one session, without the OS sandbox so that code can reach the folder): what
the kernel received holds no credential, the max_rows and max_bytes cuts are named in the warning
as before, and a forged request or a swapped exchange folder makes the host write nowhere else.
"""

from __future__ import annotations

import datetime
import decimal
import json
import logging
import os
import sqlite3
from pathlib import Path

import pandas
import pyarrow
import pytest

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.broker.databases import DatabaseEntry, Databases, QueryAnswer, QueryRefused
from ivralo_kernel.host.broker.result_segments import SQL_SEGMENT_PREFIX, ResultSegments
from ivralo_kernel.host.broker.vault import CredentialVault
from ivralo_kernel.kernel import broker_rows

SECRET = 's3cret-"api"-key'  # a quote in it: its JSON-escaped form differs from the value
ROWS = 3_000  # past the first batch: Arrow


def make_items(path: Path, rows: int = ROWS, secret_at: int = 1_234) -> Path:
    with sqlite3.connect(path) as db:
        db.execute("create table items (id integer primary key, name text, price real, note text, raw blob)")
        db.executemany(
            "insert into items values (?, ?, ?, ?, ?)",
            (
                (i, f"item-{i}", i * 0.5, f"see {SECRET} here" if i == secret_at else None, bytes([i % 256]))
                for i in range(1, rows + 1)
            ),
        )
    db.close()
    return path


# --------------------------------------------------------------------------- host side, no process


@pytest.fixture
def databases(tmp_path: Path) -> Databases:
    path = make_items(tmp_path / "items.sqlite")
    env = {"ITEMS_DB_URL": f"sqlite:///{path}", "SHOP_API_KEY": SECRET, "SHOP_PIN_TOKEN": "86420975"}
    vault = CredentialVault(str(tmp_path), env, ["ITEMS_DB_URL"], use_dotenv=False)
    entries = {
        "items": DatabaseEntry("items", "ITEMS_DB_URL", from_config_home=True),
        "items_small": DatabaseEntry("items_small", "ITEMS_DB_URL", max_bytes=50_000, from_config_home=True),
    }
    return Databases(entries, vault, str(tmp_path))


def both(databases: Databases, sql: str, name: str = "items") -> tuple[QueryAnswer, QueryAnswer]:
    """The JSON answer and the Arrow answer of one query; the Arrow one did come as a table."""
    as_json, as_arrow = databases.query(name, sql, {}), databases.query(name, sql, {}, pyarrow)
    assert as_arrow.table is not None and not as_arrow.rows
    return as_json, as_arrow


def same_values(as_json: QueryAnswer, as_arrow: QueryAnswer) -> None:
    dicts = [dict(zip(as_json.columns, row, strict=True)) for row in as_json.rows]
    assert broker_rows.dicts(as_arrow.table, as_arrow.columns, as_arrow.json_columns) == dicts
    frame = pandas.DataFrame(as_json.rows, columns=as_json.columns)
    from_arrow = broker_rows.frame(as_arrow.table, as_arrow.columns, as_arrow.json_columns)
    assert list(from_arrow.dtypes) == list(frame.dtypes)
    assert from_arrow.equals(frame)


@pytest.mark.fast
def test_an_arrow_answer_holds_the_json_answers_values(databases: Databases) -> None:
    """Every column the bench's shape has, and the ones JSON converts: bytes (base64), mixed int and
    float (JSON text), NaN and infinity ("nan", "inf"), all-null, repeated names, a column whose type
    changes after the first batch."""
    sql = (
        "select id, name, price, note, raw, null as empty, id as id,"
        " case when id % 2 = 0 then id else id * 1.5 end as mixed,"
        " case when id % 7 = 0 then 1e999 else price end as inf,"
        " case when id > 2500 then 'late' else id end as late"
        " from items"
    )
    as_json, as_arrow = both(databases, sql)
    assert len(as_json.rows) == ROWS and as_arrow.table.num_rows == ROWS
    assert as_arrow.json_columns == [7, 8, 9]
    same_values(as_json, as_arrow)


@pytest.mark.fast
def test_dates_and_decimals_become_what_json_made_of_them(tmp_path: Path) -> None:
    """What PostgreSQL's driver gives (dates, Decimals): seen through ArrowRows directly."""
    from ivralo_kernel.host.broker.arrow_rows import ArrowRows
    from ivralo_kernel.host.broker.databases import _as_json, _json_value

    vault = CredentialVault(str(tmp_path), {}, use_dotenv=False)
    rows = [(datetime.date(2026, 1, i), decimal.Decimal(i) / 4, datetime.timedelta(seconds=i)) for i in range(1, 29)]
    arrow = ArrowRows(pyarrow, 3, 1 << 20, vault, _json_value, QueryRefused)
    assert arrow.add(rows)
    table, json_columns = arrow.table()
    expected, _ = _as_json(rows)
    got = broker_rows.dicts(table, ["d", "n", "t"], json_columns)
    assert got == [dict(zip(["d", "n", "t"], row, strict=True)) for row in expected]


@pytest.mark.fast
def test_a_credential_inside_an_arrow_value_is_redacted(databases: Databases) -> None:
    as_json, as_arrow = both(databases, "select id, note, case when id = 7 then 1 else note end as mixed from items")
    dicts = broker_rows.dicts(as_arrow.table, as_arrow.columns, as_arrow.json_columns)
    assert dicts[1_233]["note"] == "see <SHOP_API_KEY> here" and dicts[1_233]["mixed"] == "see <SHOP_API_KEY> here"
    assert SECRET not in json.dumps(dicts) and json.dumps(SECRET)[1:-1] not in json.dumps(dicts)
    same_values(as_json, as_arrow)


@pytest.mark.fast
def test_a_credential_written_as_a_number_is_refused(databases: Databases) -> None:
    with pytest.raises(QueryRefused, match=r"a number in column 2 of the result holds the value of SHOP_PIN_TOKEN"):
        databases.query("items", "select id, case when id = 99 then 86420975 else id end from items", {}, pyarrow)


@pytest.mark.fast
def test_max_bytes_cuts_an_arrow_answer_where_its_bytes_reach_it(databases: Databases) -> None:
    answer = databases.query("items_small", "select id, name from items", {}, pyarrow)
    assert answer.table is not None
    # 8 bytes per id, a name's bytes and 4 per name: the rows whose sum stays within 50,000 bytes.
    sizes = [8 + len(f"item-{i}") + 4 for i in range(1, ROWS + 1)]
    fits = max(n for n in range(ROWS + 1) if sum(sizes[:n]) <= 50_000)
    assert answer.table.num_rows == fits
    assert answer.cut == f"cut at {fits} rows: 50000 bytes (max_bytes of items_small)"


@pytest.mark.fast
def test_a_segment_is_written_only_in_the_folder_the_host_opened(tmp_path: Path) -> None:
    """The folder's path now a symlink to another folder (code renamed the folder and put one in its
    place): the segment still goes into the folder the host opened, under a name of the host's."""
    folder, moved, decoy = tmp_path / "exchange", tmp_path / "moved", tmp_path / "decoy"
    folder.mkdir()
    decoy.mkdir()
    segments = ResultSegments(str(folder))
    try:
        folder.rename(moved)
        folder.symlink_to(decoy)
        path, length = segments.write(pyarrow, pyarrow.table({"0": [1, 2, 3]}))
        assert list(decoy.iterdir()) == []
        (written,) = moved.iterdir()
        assert written.name.startswith(SQL_SEGMENT_PREFIX) and path == str(folder / written.name)
        assert written.stat().st_size == length
        segments.sweep()
        assert list(moved.iterdir()) == []
    finally:
        segments.close()


# --------------------------------------------------------------------------- through a kernel

FORGED = """
from ivralo_kernel.kernel.broker_client import BROKER
payload = {{"database": "items", "query": "select * from items", "params": {{}}, "arrow": True,
           "path": {forged!r}, "segment": {forged!r}, "length": 1 << 40, "size": 1 << 40, "capacity": 1 << 40}}
answer = BROKER.ask("sql", payload, 60)
arrow = answer["result"]["arrow"]
print(arrow["path"], arrow["length"], arrow["rows"])
import os
os.unlink(arrow["path"])  # not read: the next step counts the segments in the folder
"""


def items_workspace(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_items(workspace / "items.sqlite")
    monkeypatch.setenv("ITEMS_DB_URL", f"sqlite:///{path}")
    monkeypatch.setenv("SHOP_API_KEY", SECRET)
    databases = {
        "items": "ITEMS_DB_URL",
        "items_rows": {"url_env": "ITEMS_DB_URL", "max_rows": 2_500},
        "items_bytes": {"url_env": "ITEMS_DB_URL", "max_bytes": 50_000},
    }
    (workspace / "databases.json").write_text(json.dumps(databases))


def output(result: str | dict[str, str]) -> str:
    assert isinstance(result, str), result
    return result


async def test_arrow_answers_in_a_kernel(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ivralo_kernel.host.broker.responder")
    items_workspace(workspace, monkeypatch)
    forged = tmp_path / "forged"
    async with Session(workspace=workspace, grants=("databases",), config=WorkerConfig(sandbox="off")) as session:
        # The secret inside a value: redacted in what the kernel got, as dicts and as a DataFrame.
        out = output(
            await session.run(
                "import json\n"
                'rows = ivralo.sql("items", "select * from items")\n'
                'df = ivralo.sql("items", "select * from items", dataframe=True)\n'
                "text = json.dumps(rows) + df.to_json()\n"
                f"print(len(rows), df.shape, rows[1233]['note'], df['note'][1233], {SECRET!r} in text)"
            )
        )
        assert out.startswith(f"{ROWS} (3000, 5) see <SHOP_API_KEY> here see <SHOP_API_KEY> here False\n"), out
        assert SECRET not in out
        logged = [r.getMessage() for r in caplog.records if "items database" in r.getMessage()]
        assert logged and all(f"{ROWS} rows (Arrow)" in line for line in logged), logged

        # The cuts, named as for a JSON answer.
        out = output(
            await session.run(
                "import warnings\nwith warnings.catch_warnings(record=True) as caught:\n"
                '    warnings.simplefilter("always")\n'
                '    a = ivralo.sql("items_rows", "select id from items")\n'
                '    b = ivralo.sql("items_bytes", "select id, name from items")\n'
                "print(len(a), len(b), [str(w.message) for w in caught])"
            )
        )
        assert out.startswith(
            "2500 2433 ['ivralo: the result of the query on items_rows was cut at 2500 rows (max_rows of items_rows "
            "in databases.json)', 'ivralo: the result of the query on items_bytes was cut at 2433 rows: 50000 bytes "
            "(max_bytes of items_bytes)']\n"
        ), out

        # A request with a segment's name and size of its own: the host writes where it chose, no more.
        out = output(await session.run(FORGED.format(forged=str(forged))))
        path, length, rows = out.splitlines()[0].split()
        folder = os.path.dirname(path)
        assert os.path.basename(path).startswith(SQL_SEGMENT_PREFIX) and int(rows) == ROWS
        assert 0 < int(length) < 1 << 20 and not forged.exists()

        # The exchange folder renamed and a symlink to another folder in its place (done from here, as
        # code in the kernel could): the host still writes into its own folder, which the kernel no
        # longer finds at the path it was given, and never into the other one.
        decoy, moved = tmp_path / "decoy", folder + "-moved"
        decoy.mkdir()
        try:
            os.rename(folder, moved)
            os.symlink(decoy, folder)
            error = await session.run('ivralo.sql("items", "select * from items")')
            assert isinstance(error, dict) and "could not be read from the exchange folder" in error["error"], error
            assert list(decoy.iterdir()) == []
            assert [n for n in os.listdir(moved) if n.startswith(SQL_SEGMENT_PREFIX)], os.listdir(moved)
        finally:
            os.unlink(folder)
            os.rename(moved, folder)
