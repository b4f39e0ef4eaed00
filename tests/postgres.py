"""A throwaway PostgreSQL server for the suite (a pytest plugin, loaded by conftest.py).

``pg_url`` (session scope) is a SQLAlchemy URL, ``postgresql+psycopg://app:<password>@127.0.0.1:<port>/appdb``,
of a cluster made for this run: listening on 127.0.0.1 only, on a free port, its own socket
directory, and scram-sha-256 on TCP, so the role really logs in with its password (random per run).
The cluster is stopped and its directory removed at the end of the session.

Recipe: /work/shared/notes/test-infrastructure.md §2. As root, initdb and postgres run as the
``postgres`` user (they refuse root). Debian keeps the server binaries off PATH, under
``/usr/lib/postgresql/<major>/bin``. Without them the tests that need the server are skipped,
except under CI (``CI=true``), where a missing server is a failure: CI must run them.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from typing import NoReturn

import pytest

INSTALL_HINT = "apt-get install -y postgresql"
PG_USER = "app"
PG_DATABASE = "appdb"


def _server_bindir() -> str | None:
    ctls = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")
    if not ctls:
        return None
    newest = max(ctls, key=lambda path: int(path.split("/")[4]) if path.split("/")[4].isdigit() else 0)
    return os.path.dirname(newest)


def _missing(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must run the PostgreSQL tests ({INSTALL_HINT})", pytrace=False)
    pytest.skip(f"{reason} ({INSTALL_HINT})")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    bindir = _server_bindir()
    if bindir is None:
        _missing("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin")
    try:
        import psycopg  # noqa: F401 - the driver the URL names; in the test extra
    except ImportError:
        _missing("the psycopg driver is not installed (pip install -e '.[test]')")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base = tempfile.mkdtemp(prefix="pgtest-", dir="/tmp")  # short: a socket path is at most 107 bytes
    if as_pg:
        shutil.chown(base, "postgres", "postgres")
    data, log, port = f"{base}/data", f"{base}/server.log", _free_port()
    password = f"pw-{secrets.token_hex(12)}"

    def run(*argv: str) -> None:
        subprocess.run([*as_pg, *argv], check=True, capture_output=True, text=True, timeout=60)

    started = False
    try:
        run(f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "--auth-host=scram-sha-256",
            "-E", "UTF8", "--no-locale", "--no-sync")  # fmt: skip
        run(f"{bindir}/pg_ctl", "-D", data, "-l", log, "-w", "-t", "30", "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {base} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off", "start")  # fmt: skip
        started = True
        # Over the private socket (trust) as the superuser: the app role and its database.
        run(f"{bindir}/psql", "-h", base, "-p", str(port), "-U", "postgres", "-v", "ON_ERROR_STOP=1",
            "-c", f"CREATE ROLE {PG_USER} LOGIN PASSWORD '{password}'",
            "-c", f"CREATE DATABASE {PG_DATABASE} OWNER {PG_USER}")  # fmt: skip
    except subprocess.CalledProcessError as exc:  # show stderr and the server log, not just "exit 1"
        tail = open(log).read()[-2000:] if os.path.exists(log) else ""
        if started:
            subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                           capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"{exc.cmd[len(as_pg)]} failed:\n{exc.stderr}\n{tail}") from None
    try:
        yield f"postgresql+psycopg://{PG_USER}:{password}@127.0.0.1:{port}/{PG_DATABASE}"
    finally:
        subprocess.run([*as_pg, f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=60)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)
