"""Proof that a refused name never reaches DNS: a resolver stub on loopback counts every query.

Each case runs tests/dns_stub_run.py in fresh mount and network namespaces (``unshare``, as root):
loopback only, ``/etc/resolv.conf`` pointing at a stub DNS server on 127.0.0.1:53 that records
every question, ``/etc/hosts`` with localhost only and ``hosts: files dns`` in nsswitch.conf. A
guarded kernel there (``Session``, nobody to ask) looks up ``allowed.test`` (in hosts.allow) and
``refused.test`` (not) through getaddrinfo, gethostbyname and gethostbyname_ex.

* guarded: the stub saw ``allowed.test`` (so the kernel's lookups do reach it, and a lookup of
  ``refused.test`` would have been seen) and nothing with ``refused`` in its name, search-domain
  variants included; each refusal is the guard's gaierror.
* control: the same with ``refused.test`` allowed too; the stub then sees it and the resolver
  answers NXDOMAIN. This is the case that shows the counting works for that very name.

Needs ``unshare --mount --net`` (root). Where that is not permitted the cases are skipped, except
in CI (``CI`` set), where they fail: CI runs as root and must run this proof.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import kill_tree
from dns_stub_run import RESULT_MARKER

HELPER = Path(__file__).with_name("dns_stub_run.py")
UNSHARE = ["unshare", "--mount", "--net", "--propagation", "private"]
HELPER_TIMEOUT_S = 90.0  # the helper bounds the cell to 60 s itself; pytest's own timeout is 120 s
TYPE_A = 1

CELL = """\
import socket
print("allowed.test ->", sorted({info[4][0] for info in socket.getaddrinfo("allowed.test", 80)}))
for name, lookup in [
    ("getaddrinfo", lambda: socket.getaddrinfo("refused.test", 80)),
    ("gethostbyname", lambda: socket.gethostbyname("refused.test")),
    ("gethostbyname_ex", lambda: socket.gethostbyname_ex("refused.test")),
]:
    try:
        print(name, "answered:", lookup())
    except socket.gaierror as exc:
        print(name, "gaierror:", exc)
"""


def namespaces_or_skip() -> None:
    """Skip (fail in CI) with the reason when private mount+network namespaces are not available."""
    missing = [tool for tool in ("unshare", "ip", "mount") if shutil.which(tool) is None]
    if missing:
        reason = f"needs {', '.join(missing)} on PATH"
    else:
        probe = subprocess.run(
            [*UNSHARE, "ip", "link", "set", "lo", "up"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return
        reason = f"`{' '.join(UNSHARE)}` is not permitted here (needs root): {probe.stderr.strip()[:300]}"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the DNS proof, but: {reason}")
    pytest.skip(reason)


def run_in_namespaces(tmp_path: Path, workspace: Path) -> dict[str, Any]:
    code_file = tmp_path / "cell.py"
    code_file.write_text(CELL)
    outer = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("mnt", "net")]
    cmd = [*UNSHARE, sys.executable, str(HELPER), *outer, str(tmp_path / "etc"), str(workspace), str(code_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()  # reaps the helper by its pid
        pytest.fail(f"the namespaced helper took over {HELPER_TIMEOUT_S} s\nstdout:\n{out}\nstderr:\n{err[-3000:]}")
    reports = [line[len(RESULT_MARKER) :] for line in out.splitlines() if line.startswith(RESULT_MARKER)]
    assert proc.returncode == 0 and len(reports) == 1, f"helper exit {proc.returncode}\n{out}\n{err[-3000:]}"
    report: dict[str, Any] = json.loads(reports[0])
    return report


def allow(ws: Path, *hosts: str) -> None:
    (ws / ".ivralo").mkdir(exist_ok=True)
    (ws / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": list(hosts)}}))


def test_a_refused_name_is_never_looked_up(tmp_path: Path, workspace: Path) -> None:
    namespaces_or_skip()
    allow(workspace, "allowed.test")
    report = run_in_namespaces(tmp_path, workspace)
    result, queries = report["result"], [tuple(q) for q in report["queries"]]
    assert isinstance(result, str), result
    seen = f"the stub saw: {queries}\ncell output:\n{result}"
    # The stub is in the kernel's path: the allowed name reached it and its answer came back.
    assert ("allowed.test", TYPE_A) in queries, seen
    assert "allowed.test -> ['127.0.0.1']" in result, seen
    # The refused name did not, under any form (search domains appended included).
    assert not [name for name, _ in queries if "refused" in name], seen
    for lookup in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        assert f"{lookup} gaierror: [Errno -2] ivralo network guard: refused.test refused (" in result, seen
    tried = result.rstrip("\n").splitlines()[-1]
    assert tried.startswith("[ivralo network: "), seen
    assert "allowed.test allowed (hosts.allow)" in tried and "refused.test refused (" in tried, seen


def test_control_an_allowed_name_is_looked_up_and_counted(tmp_path: Path, workspace: Path) -> None:
    """The same run with refused.test allowed: now the stub must count it (NXDOMAIN comes back)."""
    namespaces_or_skip()
    allow(workspace, "allowed.test", "refused.test")
    report = run_in_namespaces(tmp_path, workspace)
    result, queries = report["result"], [tuple(q) for q in report["queries"]]
    assert isinstance(result, str), result
    seen = f"the stub saw: {queries}\ncell output:\n{result}"
    assert ("allowed.test", TYPE_A) in queries, seen
    assert ("refused.test", TYPE_A) in queries, seen
    assert "ivralo network guard" not in result, seen
    for lookup in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        assert f"{lookup} gaierror: [Errno -2] Name or service not known" in result, seen
    assert "refused.test allowed (hosts.allow)" in result.rstrip("\n").splitlines()[-1], seen
