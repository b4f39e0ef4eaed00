"""Landlock guard: what the OS refuses once ``apply`` ran.

Landlock cannot be undone, so every test applies it inside a fresh ``python -c`` child and never
in the pytest process. The child applies the rules, runs a test body that records each attempt
with ``attempt(name, fn)``, and prints one JSON object that the test reads back.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from ivralo_kernel.guards.landlock import NOT_AVAILABLE, LandlockRules, abi

ABI = abi()
REPO = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT = 60

pytestmark = pytest.mark.skipif(
    ABI == 0, reason="Landlock is not available on this kernel (ABI 0), so there is nothing to enforce"
)

# Runs in the child: apply the rules (unless told not to), then the test body, then print the record.
PRELUDE = """
import json, os, subprocess, sys
from dataclasses import asdict
from ivralo_kernel.guards import landlock

spec = json.loads(sys.argv[1])
if spec["fake_abi"] is not None:
    landlock.abi = lambda: spec["fake_abi"]
rules = landlock.LandlockRules(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["rules"].items()})
try:
    out = {"result": asdict(landlock.apply(rules))}
except (OSError, ValueError) as exc:  # recorded; the body then shows the process is still unrestricted
    out = {"apply_error": [type(exc).__name__, str(exc)]}

def attempt(name, fn):
    try:
        fn()
        out[name] = "ok"
    except OSError as exc:
        out[name] = [type(exc).__name__, exc.errno, str(exc)]

def sh(name, command):
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    out[name] = [done.returncode, done.stderr]

def write(path, text="x"):
    with open(path, "w") as f:
        f.write(text)
"""


@dataclass
class Areas:
    inside: Path  # the allowed write tree
    outside: Path  # not allowed; holds `existing` (content "orig")
    existing: Path


@pytest.fixture
def areas(tmp_path: Path) -> Areas:
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    existing = outside / "existing"
    existing.write_text("orig")
    return Areas(inside, outside, existing)


def run_sandboxed(cwd: Path, rules: LandlockRules, body: str, fake_abi: int | None = None) -> dict[str, Any]:
    """Apply ``rules`` in a fresh child (cwd ``cwd``), run ``body`` there, return its record."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    spec = json.dumps({"rules": asdict(rules), "fake_abi": fake_abi})
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-c", code, spec], cwd=cwd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT
    )
    assert done.returncode == 0, f"sandboxed child failed (rc {done.returncode}):\n{done.stderr}"
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def refused(record: dict[str, Any], name: str, code: int = errno.EACCES) -> None:
    assert record[name] != "ok", f"{name} was allowed"
    kind, got, message = record[name]
    assert got == code, f"{name}: expected {errno.errorcode[code]}, got {kind} {message}"
    if code == errno.EACCES:
        assert kind == "PermissionError", f"{name}: {kind} {message}"


def test_writes_inside_the_tree_work(areas: Areas) -> None:
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),)),
        """
        attempt("open_w", lambda: write("inside/a"))
        attempt("mkdir", lambda: os.mkdir("inside/sub"))
        attempt("rename_same_dir", lambda: os.rename("inside/a", "inside/b"))
        attempt("rename_into_subdir", lambda: os.rename("inside/b", "inside/sub/c"))
        attempt("symlink", lambda: os.symlink("c", "inside/sub/link"))
        attempt("truncate", lambda: os.truncate("inside/sub/c", 0))
        attempt("remove", lambda: os.remove("inside/sub/link"))
        """,
    )
    assert record["result"]["applied"] is True
    names = ["open_w", "mkdir", "rename_same_dir", "symlink", "truncate", "remove"]
    names += ["rename_into_subdir"] if ABI >= 2 else []  # ABI 1 refuses every reparenting (EXDEV)
    for name in names:
        assert record[name] == "ok", f"{name}: {record[name]}"
    assert (areas.inside / "sub" / "c").exists()
    assert not (areas.inside / "sub" / "link").exists()


def test_writes_outside_are_refused_with_eacces(areas: Areas) -> None:
    (areas.inside / "mine").write_text("mine")
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),)),
        """
        attempt("open_w", lambda: write("outside/new"))
        attempt("open_a_existing", lambda: open("outside/existing", "a").close())
        attempt("os_open_creat", lambda: os.close(os.open("outside/new2", os.O_CREAT | os.O_WRONLY, 0o600)))
        attempt("remove", lambda: os.remove("outside/existing"))
        attempt("rename_out_to_in", lambda: os.rename("outside/existing", "inside/stolen"))
        attempt("rename_in_to_out", lambda: os.rename("inside/mine", "outside/mine"))
        attempt("symlink", lambda: os.symlink("/etc/passwd", "outside/link"))
        attempt("truncate", lambda: os.truncate("outside/existing", 0))
        attempt("mkdir", lambda: os.mkdir("outside/dir"))
        """,
    )
    for name in ("open_w", "open_a_existing", "os_open_creat", "remove", "symlink", "mkdir"):
        refused(record, name)
    # ABI 1 refuses every rename across directories with EXDEV; from ABI 2 it is a plain EACCES.
    for name in ("rename_out_to_in", "rename_in_to_out"):
        refused(record, name, errno.EACCES if ABI >= 2 else errno.EXDEV)
    if ABI >= 3:  # TRUNCATE is a handled right from ABI 3; before that truncate(2) is not covered
        refused(record, "truncate")
        assert areas.existing.read_text() == "orig"
    assert sorted(p.name for p in areas.outside.iterdir()) == ["existing"]
    assert (areas.inside / "mine").read_text() == "mine"


def test_reading_outside_still_works(areas: Areas) -> None:
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),)),
        """
        out["content"] = open("outside/existing").read()
        out["listing"] = os.listdir("outside")
        out["passwd_readable"] = len(open("/etc/passwd").read()) > 0
        """,
    )
    assert record["content"] == "orig"
    assert record["listing"] == ["existing"]
    assert record["passwd_readable"] is True


def test_shell_child_is_refused_by_the_os(areas: Areas) -> None:
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),)),
        """
        sh("outside", "echo x > outside/from_sh")
        sh("inside", "echo x > inside/from_sh")
        """,
    )
    rc, stderr = record["outside"]
    assert rc != 0
    assert "Permission denied" in stderr
    assert not (areas.outside / "from_sh").exists()
    assert record["inside"] == [0, ""]
    assert (areas.inside / "from_sh").read_text() == "x\n"


def test_python_child_inherits_the_restriction(areas: Areas) -> None:
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),)),
        """
        for name, target in (("outside", "outside/from_py"), ("inside", "inside/from_py")):
            code = f"open({target!r}, 'w').write('x')"
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
            out[name] = [done.returncode, done.stderr]
        """,
    )
    rc, stderr = record["outside"]
    assert rc != 0
    assert "PermissionError: [Errno 13]" in stderr
    assert not (areas.outside / "from_py").exists()
    assert record["inside"] == [0, ""]
    assert (areas.inside / "from_py").read_text() == "x"


def test_dev_null_writable_only_as_a_write_file(areas: Areas) -> None:
    body = """
    attempt("dev_null", lambda: write("/dev/null"))
    sh("sh_dev_null", "echo x > /dev/null")
    """
    without = run_sandboxed(areas.inside.parent, LandlockRules(write_trees=(str(areas.inside),)), body)
    refused(without, "dev_null")
    with_rule = run_sandboxed(
        areas.inside.parent, LandlockRules(write_trees=(str(areas.inside),), write_files=("/dev/null",)), body
    )
    assert with_rule["dev_null"] == "ok"
    assert with_rule["sh_dev_null"] == [0, ""]


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two listening sockets on 127.0.0.1: (allowed port, other port). A connect completes in the
    kernel's backlog, so nobody needs to accept."""
    socks = []
    try:
        for _ in range(2):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind(("127.0.0.1", 0))
            sock.listen(8)
        yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.skipif(ABI < 4, reason=f"TCP rules need Landlock ABI >= 4 (this kernel has ABI {ABI})")
def test_tcp_connect_only_to_allowed_ports(areas: Areas, listeners: tuple[int, int]) -> None:
    ok_port, other_port = listeners
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),), connect_ports=(ok_port,), bind_ports=()),
        f"""
        import socket
        def connect(port):
            with socket.create_connection(("127.0.0.1", port), timeout=10):
                pass
        def bind():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
        attempt("allowed", lambda: connect({ok_port}))
        attempt("other", lambda: connect({other_port}))
        attempt("bind", bind)
        """,
    )
    assert record["result"]["handled"] == ["fs-write", "tcp-connect", "tcp-bind"]
    assert record["allowed"] == "ok"
    refused(record, "other")
    refused(record, "bind")


def test_handled_lists_what_was_applied(areas: Areas) -> None:
    record = run_sandboxed(areas.inside.parent, LandlockRules(write_trees=(str(areas.inside),)), "")
    assert record["result"] == {"abi": ABI, "applied": True, "handled": ["fs-write"], "reason": "", "skipped": []}
    if ABI >= 6:
        scoped = run_sandboxed(
            areas.inside.parent,
            LandlockRules(write_trees=(str(areas.inside),), scope_signals=True),
            # signal 0 only checks permission: the parent (pytest) is outside the domain
            'attempt("signal_parent", lambda: os.kill(os.getppid(), 0))',
        )
        assert scoped["result"]["handled"] == ["fs-write", "signal-scope"]
        refused(scoped, "signal_parent", errno.EPERM)


def test_nonexistent_write_tree_is_skipped(areas: Areas) -> None:
    missing = str(areas.inside.parent / "missing")
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(missing, str(areas.inside))),
        """
        attempt("inside", lambda: write("inside/a"))
        attempt("outside", lambda: write("outside/a"))
        attempt("create_missing", lambda: os.mkdir("missing"))
        """,
    )
    assert record["result"]["applied"] is True
    assert record["result"]["skipped"] == [missing]
    assert missing in record["result"]["reason"]
    assert record["inside"] == "ok"
    refused(record, "outside")
    refused(record, "create_missing")


def test_bad_rules_raise_before_restricting(areas: Areas) -> None:
    body = 'attempt("outside", lambda: write("outside/still_writable"))'
    as_file = run_sandboxed(areas.inside.parent, LandlockRules(write_trees=(str(areas.existing),)), body)
    assert as_file["apply_error"][0] == "NotADirectoryError"
    assert "must be a directory" in as_file["apply_error"][1]
    assert as_file["outside"] == "ok"
    bad_port = run_sandboxed(areas.inside.parent, LandlockRules(connect_ports=(70000,)), body)
    assert bad_port["apply_error"][0] == "ValueError"
    assert bad_port["outside"] == "ok"


def test_abi_0_changes_nothing_and_says_why(areas: Areas) -> None:
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),), connect_ports=(1,)),
        'attempt("outside", lambda: write("outside/a"))',
        fake_abi=0,
    )
    assert record["result"] == {"abi": 0, "applied": False, "handled": [], "reason": NOT_AVAILABLE, "skipped": []}
    assert record["outside"] == "ok"


def test_old_abi_applies_the_filesystem_part_and_names_the_tcp_gap(areas: Areas) -> None:
    # The real kernel accepts an ABI 3 ruleset (a subset), so this runs the ABI 3 code path for real.
    record = run_sandboxed(
        areas.inside.parent,
        LandlockRules(write_trees=(str(areas.inside),), connect_ports=(1,)),
        """
        attempt("outside", lambda: write("outside/a"))
        attempt("inside", lambda: write("inside/a"))
        """,
        fake_abi=3,
    )
    result = record["result"]
    assert (result["abi"], result["applied"], result["handled"]) == (3, True, ["fs-write"])
    assert "TCP port rules need Landlock ABI >= 4" in result["reason"]
    refused(record, "outside")
    assert record["inside"] == "ok"
