"""The fallback under the emulated container (Docker's default seccomp profile, tests/container.py),
on both launch paths: a host script (tests/fallback_attempts.py) runs under the container's filter,
starts two kernels with the ``ivralo`` kernelspec (no sandbox can be built there, so both run in
the fallback) and makes the attempts. Judged here, from outside: the loopback server's hits, the
marker kernel B would write, and the report's prompts (what the client itself got on stdin)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from container import command
from sandbox_cases import counting_http

from ivralo_kernel.guards import landlock
from ivralo_kernel.host.sandbox.egress import untrusted_note

pytestmark = [
    pytest.mark.timeout(400),
    pytest.mark.skipif(landlock.abi() < 6, reason="Landlock's TCP rule (ABI 4) and scope (ABI 6) are what is tested"),
]
SCRIPT = Path(__file__).resolve().parent / "fallback_attempts.py"


def attempts(tmp_path: Path, port: int, raw: bool) -> tuple[dict[str, Any], Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    marker = b / "marker-written-by-b"
    argv = ["python", str(SCRIPT), "-", str(port), str(a), str(b), str(marker)] + (["--raw"] if raw else [])
    import sys

    argv[0] = sys.executable
    done = subprocess.run(command("docker-default", argv), capture_output=True, text=True, timeout=360, check=False)
    line = next((line for line in done.stdout.splitlines() if line.startswith("REPORT ")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(line.removeprefix("REPORT ")), marker


@pytest.mark.parametrize("raw", [False, True], ids=["provisioner", "raw-launch"])
def test_in_a_container_the_fallback_reaches_the_network_only_through_the_proxy_and_no_other_kernel(
    tmp_path: Path, raw: bool
) -> None:
    with counting_http() as (port, hits):
        report, marker = attempts(tmp_path, port, raw)
        got = sorted(hits)
    text = json.dumps(report, indent=1)
    assert all(layer.startswith("none (") for layer in report["layers"]), text  # the fallback, both kernels
    direct = report["direct"]
    assert direct["sh"] == "rc=7\n" and direct["child"].startswith("refused 13") and direct["ctypes"] == [-1, 13], text
    if raw:
        assert got == [], text  # nobody to ask in a raw launch: refused through the proxy too
    else:
        prompts = report["asked"]["prompts"]
        note = untrusted_note(os.path.realpath(tmp_path / "a"))  # kernel A's folder, not trusted
        question = f"Code in this cell wants to reach localhost, this machine, port {port}{note}. Allow? [yes/no] "
        assert prompts == [question], text
        assert got == ["/yes"], text  # exactly one hit: the proxied request after the person's yes
    tried = report["into_b"]
    assert "no result" not in tried and any(f.endswith("/connection.json") for f in tried), text  # B's own, too
    # Landlock's read floor keeps them unreadable; where one is read, what it sent reached no kernel
    # (jupyter_client timed out waiting for a reply).
    assert all(o in ("read; child: TimeoutError", "unreadable PermissionError") for o in tried.values()), text
    assert not marker.exists(), text
    assert report["b_alive"] == "42\n", text
