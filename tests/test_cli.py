"""``ivralo-kernel install`` and ``run``, and ``jupyter console --kernel ivralo`` in a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from console import jupyter_console

from ivralo_kernel.cli import main
from ivralo_kernel.cli.install import install

BIN = Path(sys.executable).parent


@pytest.mark.fast
def test_install_writes_an_absolute_interpreter_and_the_provisioner(tmp_path: Path) -> None:
    where = Path(install(prefix=str(tmp_path)))
    assert where == tmp_path / "share" / "jupyter" / "kernels" / "ivralo"
    spec = json.loads((where / "kernel.json").read_text())
    assert os.path.isabs(spec["argv"][0]) and spec["argv"][0] == sys.executable
    assert spec["argv"][-2:] == ["-f", "{connection_file}"]
    assert spec["metadata"]["kernel_provisioner"]["provisioner_name"] == "ivralo-provisioner"
    assert spec["display_name"] == "Python (ivralo)"
    assert (where / "logo-svg.svg").is_file()


def test_install_with_another_interpreter(tmp_path: Path) -> None:
    other = BIN / "python"  # a different path to an interpreter that has ivralo installed
    assert main(["install", "--prefix", str(tmp_path), "--name", "ivralo-other", "--python", str(other)]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/ivralo-other/kernel.json").read_text())
    assert spec["argv"][0] == str(other)


def test_install_refuses_an_interpreter_without_ivralo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    code = main(["install", "--prefix", str(tmp_path), "--python", str(bare / "bin" / "python")])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot import ivralo_kernel" in err and "-m pip install ivralo-kernel" in err


@pytest.mark.fast
def test_install_refuses_a_missing_interpreter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["install", "--prefix", str(tmp_path), "--python", str(tmp_path / "nope")]) == 2
    assert "not an executable file" in capsys.readouterr().err


def test_run_prints_each_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("n = 5"), nbformat.v4.new_code_cell("print(n * 8 + 2)")]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert "print(n * 8 + 2)" in out and "  | 42" in out and "2 code cells, 0 with an error" in out


def test_jupyter_console(tmp_path: Path) -> None:
    with jupyter_console("ivralo", tmp_path, first_cell=False) as child:
        child.sendline("print(6 * 7)")
        child.expect("42")
        child.expect(r"In \[2\]: ")
        child.sendline("get_ipython().kernel.implementation")
        child.expect("ivralo")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    assert child.exitstatus == 0


def test_doctor_reports_each_mechanism(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GITHUB_PAT", "ghp-doctor-marker")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent-doctor-marker")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("SMTP_PASS=smtp-doctor-marker\nPLAIN=1\n")
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    by_name = {c["mechanism"]: c for c in report["checks"]}
    assert set(by_name) == {
        "OS sandbox",
        "memory cap",
        "write floor (Landlock)",
        "TCP connect floor",
        "python-level guards",
        "credential scrub",
        "not dumpable",
        "subreaper",
        "parent-death signal",
        "core dumps",
        "credential broker",
    }
    for check in report["checks"]:  # a missing mechanism always comes with a next step
        assert check["status"] == "ok" or check["next_step"], check
    assert by_name["subreaper"]["status"] == by_name["parent-death signal"]["status"] == "ok"
    sandbox = by_name["OS sandbox"]  # used by default where it can be built (here, and on CI)
    assert sandbox["status"] == "ok", sandbox
    assert sandbox["detail"].startswith("bwrap: user, mount, pid, ipc, uts, net and cgroup namespaces"), sandbox
    assert "network only through the host's egress proxy" in sandbox["detail"], sandbox
    assert (
        "operations: credential set for none; not set for photos.search (IVRALO_UNSPLASH_ACCESS_KEY)"
        in (by_name["credential broker"]["detail"])
    )
    scrubbed = by_name["credential scrub"]["detail"]  # by name, never by value
    assert "GITHUB_PAT" in scrubbed and "SSH_AUTH_SOCK" in scrubbed and "SMTP_PASS" in scrubbed, scrubbed
    assert "PLAIN" not in scrubbed and "doctor-marker" not in json.dumps(report)
    assert code == (0 if report["ok"] else 1)
