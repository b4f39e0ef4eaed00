"""``ivralo-kernel install`` and ``run``, and ``jupyter console --kernel ivralo`` in a terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
from console import jupyter_console

from ivralo_kernel.cli import main
from ivralo_kernel.cli.install import install
from ivralo_kernel.host.sandbox.memory_cgroup import find_place

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
    assert main(["run", str(path)]) == 0, "a clean notebook exits 0"
    out, err = capsys.readouterr()
    assert "print(n * 8 + 2)" in out and "  | 42" in out and "2 code cells, 0 with an error" in out
    # Progress goes to stderr, and stderr is not a terminal here: one plain line per cell, no \r.
    lines = [line for line in err.splitlines() if line.startswith("cell ")]
    assert [line.split(" (")[0] for line in lines] == ["cell 1/2 ok", "cell 2/2 ok"], err
    assert all(line.endswith(" s)") for line in lines) and "\r" not in err, err


def test_run_shows_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a real terminal (a pty): one line rewritten in place per cell, then cleared before the report."""
    path = notebook(tmp_path, "import time", "time.sleep(0.3)", "print('done', 6 * 7)")
    child = pexpect.spawn(
        str(BIN / "ivralo-kernel"), ["run", str(path)], cwd=str(tmp_path), encoding="utf-8", timeout=60,
        dimensions=(24, 100),
    )  # fmt: skip
    try:
        child.expect(pexpect.EOF)
    finally:
        child.close()
    shown = child.before
    assert child.exitstatus == 0, shown
    for number, first in enumerate(["import time", "time.sleep(0.3)", "print('done', 6 * 7)"], start=1):
        done = round(20 * (number - 1) / 3)
        assert f"\r\x1b[K[{number}/3] {'#' * done}{'-' * (20 - done)} cell {number}: {first}" in shown, shown
    report = shown.index("In [1]:")
    assert shown[:report].endswith("\r\x1b[K\x1b[1m"), repr(shown[:report][-40:])  # cleared, then the report
    assert "  | done 42" in shown and "cell 1/3 ok" not in shown, shown


def notebook(tmp_path: Path, *sources: str) -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    path = tmp_path / "t.ipynb"
    nbformat.write(nb, path)
    return path


def test_run_exits_1_when_a_cell_fails_and_still_runs_every_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ``jupyter nbconvert --execute`` does (and as a failing .py does), but every cell runs."""
    path = notebook(tmp_path, "x = 1", "1/0", "print('after', x)")
    assert main(["run", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "ZeroDivisionError" in out and "  | after 1" in out, out
    assert "3 code cells, 1 with an error" in out
    assert "t.ipynb: 1 of 3 code cells failed" in err


def test_deadline_ms_ends_a_looping_cell_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The host's deadline (interrupt at 1.5 s) ends the cell, not nbclient's own wait, which would
    only fire at deadline + grace + 30 s and stop the run ("stopped at cell 2: CellTimeoutError")."""
    path = notebook(tmp_path, "x = 41", "while True: pass", "print(x + 1)")
    start = time.monotonic()
    assert main(["run", str(path), "--deadline-ms", "1500"]) == 1
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert "  | interrupted: exceeded deadline_ms=1500; namespace preserved" in out, out
    assert "  | 42" in out and "3 code cells, 1 with an error" in out, out
    assert "stopped at" not in err and "1 of 3 code cells failed" in err, err
    assert "cell 2/3 error (" in err and "cell 3/3 ok (" in err, err
    assert elapsed < 30, f"liveness: the run took {elapsed:.1f} s"  # generous: kernel start + 1.5 s + grace


def test_timeout_is_the_same_deadline_for_a_py_file_and_says_it_is_deprecated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "loop.py"
    script.write_text("print('started', flush=True)\nwhile True: pass\n")
    assert main(["run", str(script), "--timeout", "1.5"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("started\n") and "interrupted: exceeded deadline_ms=1500" in out, out
    assert "--timeout is deprecated; it now means --deadline-ms 1500" in err, err


def test_jupyter_console(tmp_path: Path) -> None:
    """Its first line says what the scrub kept out: a token is a credential, tmux's socket is not."""
    session = {"TMUX": "/tmp/tmux-0/default,1,0", "TMUX_PANE": "%1", "GITHUB_PAT": "ghp-console-marker"}
    with jupyter_console("ivralo", tmp_path, first_cell=False, env=session) as child:
        first = child.before.splitlines()[0]
        assert first.endswith(
            "ivralo: kept out of the kernel: 1 credential variable (GITHUB_PAT) and 2 session sockets (TMUX, TMUX_PANE)"
        ), first
        assert "ghp-console-marker" not in child.before
        child.sendline("print(6 * 7)")
        child.expect("42")
        child.expect(r"In \[2\]: ")
        child.sendline("get_ipython().kernel.implementation")
        child.expect("ivralo")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    assert child.exitstatus == 0


@pytest.mark.timeout(90)
def test_doctor_exits_0_when_the_default_layers_hold_and_strict_fails_for_layers_that_are_off(tmp_path: Path) -> None:
    """The real command, as a CI check runs it: a layer off by default (the TCP connect floor) reads
    "off (default)" with how to turn it on and is no failure; ``--strict`` fails for it; a default layer
    turned off (the OS sandbox) is a gap: exit 1. The three doctors run at once (one kernel each)."""
    doctor = [sys.executable, "-m", "ivralo_kernel", "doctor"]
    runs = {
        "plain": doctor,
        "strict": [*doctor, "--strict", "--json"],
        "gap": [*doctor, "--json", "--IvraloSettings.sandbox=off"],
    }
    started = {
        name: subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, argv in runs.items()
    }
    done: dict[str, tuple[int, str, str]] = {}
    try:
        for name, process in started.items():
            out, err = process.communicate(timeout=80)
            done[name] = (process.returncode, out, err)
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    code, out, err = done["plain"]
    assert code == 0, (out, err[-2000:])
    (floor,) = [line for line in out.splitlines() if "TCP connect floor" in line and line.startswith("  [")]
    assert floor.startswith("  [off ] TCP connect floor      off (default): "), floor
    assert "next step: Turn it on with landlock_network=True" in out, out
    assert out.rstrip().splitlines()[-1].startswith("ivralo-kernel doctor: every layer on by default holds here"), out
    code, out, err = done["strict"]
    report = json.loads(out)
    assert code == 1 and report["ok"] and report["gaps"] == [] and "TCP connect floor" in report["not_on"], report
    (check,) = [c for c in report["checks"] if c["mechanism"] == "TCP connect floor"]
    assert check["status"] == "off" and "landlock_network=True" in check["next_step"], check
    code, out, err = done["gap"]
    report = json.loads(out)
    assert code == 1 and not report["ok"] and report["gaps"] == ["OS sandbox"], (report["gaps"], err[-2000:])


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
        "memory cgroup",
        "write floor (Landlock)",
        "TCP connect floor",
        "python-level guards",
        "credential scrub",
        "not dumpable",
        "subreaper",
        "parent-death signal",
        "core dumps",
        "seccomp",
        "unix sockets",
        "credential broker",
    }
    for check in report["checks"]:  # a missing mechanism always comes with a next step
        assert check["status"] == "ok" or check["next_step"], check
    assert by_name["subreaper"]["status"] == by_name["parent-death signal"]["status"] == "ok"
    assert by_name["seccomp"]["status"] == by_name["unix sockets"]["status"] == "ok", by_name["seccomp"]
    # The Linux kernel's limit where cgroup v2 delegates a memory cgroup, else (here, and on CI: cgroup
    # v1) what the observer alone leaves open, the probe's reason and how to get one.
    cgroup, place = by_name["memory cgroup"], find_place()
    if place.parent:
        assert cgroup["status"] == "ok" and cgroup["detail"].startswith("a memory cgroup per kernel (cgroup v2"), cgroup
    else:
        assert cgroup["status"] == "partial" and cgroup["detail"].startswith(f"no memory cgroup ({place.why})"), cgroup
        assert "the observer samples the tree" in cgroup["detail"], cgroup
        assert "systemd-run --user --scope -p Delegate=yes" in cgroup["next_step"], cgroup
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
    # Warm spares (JupyterLab): off unless asked for, and what each would cost idle. The session's
    # kernelspecs set none, unless test_prewarm's (spares=1) is installed already: then it is named.
    spares = report["spares"]
    assert spares["spares"] == 0 and spares["idle_rss_bytes"] > 0, spares
    on = {name: n for name, n in spares["kernelspecs"].items() if n > 0}
    if on:
        assert spares["detail"].startswith("on: off in the config files; set by the kernelspecs"), spares
        assert all(f"{name} ({n})" in spares["detail"] for name, n in on.items()), spares
    else:
        assert spares["detail"].startswith("off (spares=0, the default)"), spares
    assert " each (this kernel's tree, idle)" in spares["detail"], spares
    assert code == (0 if report["ok"] else 1)
