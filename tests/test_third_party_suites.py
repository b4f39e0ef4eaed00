"""Third-party test suites against the ivralo kernel: ipykernel's debugger tests, nbclient's and papermill's suites.

Each suite is its project's own sdist from PyPI (exact version, sha256 pinned), fetched once with pip into
pytest's cache, unpacked into ``tmp_path`` and run there by its own pytest, in a subprocess, with its own
configuration. The kernel names the suite starts (``python3``, and ``python`` for nbclient) are the ivralo
kernelspec, installed under those names into a private prefix that ``JUPYTER_PATH`` names. Each test asserts
the exact outcome of every test of the suite. Without PyPI the tests skip, except under ``CI=true``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ISOLATED_DIRS, kill_tree

from ivralo_kernel.cli.install import install

pytestmark = pytest.mark.slow

SDISTS = {  # name: (version, sha256 of the sdist on PyPI)
    "ipykernel": ("7.4.0", "4330114d22b9b33575b2c7c68753fc8faabbbcfbc60b0cdff9f14dd4ce63742f"),
    "nbclient": ("0.11.0", "04a134a5b087f2c5887f228aca155db50169b8cd9334dee6942c8e927e56081a"),
    "papermill": ("2.7.0", "ec10b37594a060662f57269e1ebd108c209d204450f00fdfeb70a1c7cfb7fbc8"),
}
RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def sdist_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("third-party-sdists") if cache is not None else tmp_path_factory.mktemp("sdists")


def fetch(name: str, dest: Path) -> Path:
    """The pinned sdist of ``name`` (downloaded by pip on first use, hash-checked)."""
    version, sha = SDISTS[name]
    path = dest / f"{name}-{version}.tar.gz"
    if path.is_file() and _sha256(path) == sha:
        return path
    requirement = dest / f"{name}.txt"
    requirement.write_text(f"{name}=={version} --hash=sha256:{sha}\n", encoding="utf-8")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", name]
    command += ["--require-hashes", "--dest", str(dest), "-r", str(requirement)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0 or not path.is_file():
        message = f"pip could not download the {name} {version} sdist:\n{proc.stderr[-3000:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def unpack(name: str, sdist_dir: Path, into: Path) -> Path:
    archive = fetch(name, sdist_dir)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)
    return into / f"{name}-{SDISTS[name][0]}"


def suite_env(base: Path, kernel: str, names: tuple[str, ...] = ("python3",)) -> dict[str, str]:
    """An environment where ``names`` start ``kernel``: "ivralo", or "ipykernel" (the plain kernelspec)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for var, sub in ISOLATED_DIRS:
        (base / sub).mkdir(parents=True)
        env[var] = str(base / sub)
    prefix = base / "prefix"
    (prefix / "share" / "jupyter" / "kernels").mkdir(parents=True)
    if kernel == "ivralo":
        for name in names:
            install(prefix=str(prefix), name=name)
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    # The suites call Jupyter's scripts (jupyter-execute, papermill) by name: this venv's come first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    probe = "import json; from jupyter_client.kernelspec import KernelSpecManager as K; m = K()\n"
    probe += f"print(json.dumps({{n: m.get_kernel_spec(n).argv for n in {list(names)!r}}}))"
    argvs = json.loads(subprocess.check_output([sys.executable, "-c", probe], env=env, text=True, timeout=60))
    for name, argv in argvs.items():
        assert ("ivralo_kernel.supervisor" in argv) == (kernel == "ivralo"), f"kernel {name} starts {argv}"
    return env


class RunningSuite:
    """A suite's pytest started in ``root``; ``finish`` waits for it and reads its report."""

    def __init__(self, root: Path, args: list[str], env: dict[str, str]) -> None:
        self.root = root
        self.report = root / "ivralo-report.xml"
        self.report.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "--color=no"]
        # pytest-asyncio >= 1.x warns (an error under the suites' filterwarnings) when this is unset.
        command += ["-o", "asyncio_default_fixture_loop_scope=function", f"--junitxml={self.report}"]
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def stop(self) -> None:
        """End it if it still runs (a test that failed before finishing it)."""
        if self.proc.poll() is None:
            kill_tree(self.proc.pid)
            self.proc.communicate()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def finish(self, timeout: float) -> dict[str, tuple[str, str]]:
        """{test id: (outcome, failure text)}; ``timeout`` counts from the start."""
        proc, root = self.proc, self.root
        try:
            output, _ = proc.communicate(timeout=max(1.0, self.start + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
            output, _ = proc.communicate()
            pytest.fail(f"{root.name} did not finish within {timeout} s:\n{output[-6000:]}")
        print(f"{root.name}: pytest exited {proc.returncode} after {time.monotonic() - self.start:.0f} s")
        assert self.report.is_file(), f"{root.name}: no report (exit {proc.returncode}):\n{output[-6000:]}"
        outcomes: dict[str, tuple[str, str]] = {}
        for case in ET.parse(self.report).iter("testcase"):
            test_id = f"{case.get('classname')}::{case.get('name')}"
            outcome, text = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed"}.get(child.tag, child.tag)
                    text = f"{child.get('message', '')}\n{child.text or ''}"
            # A test may be reported more than once (flaky's reruns, an error at teardown): keep the worst.
            if test_id not in outcomes or RANK[outcome] >= RANK[outcomes[test_id][0]]:
                outcomes[test_id] = (outcome, text)
        return outcomes


def run_suite(root: Path, args: list[str], env: dict[str, str], timeout: float) -> dict[str, tuple[str, str]]:
    """Run the suite's pytest in ``root``; return {test id: (outcome, failure text)}."""
    return RunningSuite(root, args, env).finish(timeout)


@pytest.fixture(scope="module")
def nbclient_running(tmp_path_factory: pytest.TempPathFactory, sdist_dir: Path) -> Iterator[RunningSuite]:
    """nbclient's suite, started as this module starts: it runs beside the debugger's and papermill's
    (these suites mostly wait on kernels; one after the other they took over 4 of CI's 25 minutes)."""
    base = tmp_path_factory.mktemp("nbclient")
    root = unpack("nbclient", sdist_dir, base)
    env = suite_env(base / "jupyter", "ivralo", names=("python3", "python"))
    args = ["tests", f"--basetemp={base / SUITE_TMP}", *(f"--deselect={test}" for test in NBCLIENT_RACES_ITS_THREAD)]
    running = RunningSuite(root, args, env)
    yield running
    running.stop()


def not_passed(outcomes: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {test: outcome for test, (outcome, _) in outcomes.items() if outcome != "passed"}


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("nbclient_running")  # started first: it runs beside this one
def test_ipykernel_debugger_suite(tmp_path: Path, sdist_dir: Path) -> None:
    """ipykernel's tests/test_debugger.py: tests/utils.py's new_kernel() starts the ``python3`` kernelspec."""
    root = unpack("ipykernel", sdist_dir, tmp_path)
    env = suite_env(tmp_path / "jupyter", "ivralo")
    outcomes = run_suite(root, ["tests/test_debugger.py"], env, timeout=360)
    assert len(outcomes) == 12, sorted(outcomes)
    assert not_passed(outcomes) == {}, {t: text[-3000:] for t, (o, text) in outcomes.items() if o != "passed"}


# papermill's tests of its cloud storage handlers need azure, boto3/moto, gcsfs or pyarrow and start no kernel.
PAPERMILL_CLOUD_ONLY = ("test_abs.py", "test_adl.py", "test_gcs.py", "test_hdfs.py", "test_s3.py")
PAPERMILL_FAILS_WITH_ANY_KERNEL = {
    # broken2.ipynb imports `display` from IPython.core.display, which IPython 9 no longer has.
    "papermill.tests.test_execute.TestBrokenNotebook2::test": "failed",
}


@pytest.mark.timeout(600)
def test_papermill_suite_same_as_ipykernel(tmp_path: Path, sdist_dir: Path) -> None:
    """papermill's suite twice: ``python3`` as ipykernel's own kernelspec, then as ivralo's; same outcomes."""
    args = ["papermill/tests", *(f"--ignore=papermill/tests/{name}" for name in PAPERMILL_CLOUD_ONLY)]
    runs = []
    try:  # both at once, each in its own copy (they mostly wait on kernels)
        for kernel in ("ipykernel", "ivralo"):
            root = unpack("papermill", sdist_dir, tmp_path / f"src-{kernel}")
            runs.append(RunningSuite(root, args, suite_env(tmp_path / kernel, kernel)))
        plain, ivralo = (run.finish(timeout=420) for run in runs)
    finally:
        for run in runs:
            run.stop()
    assert len(plain) == 502, sorted(plain)
    assert not_passed(plain) == PAPERMILL_FAILS_WITH_ANY_KERNEL, not_passed(plain)
    differ = {t: (plain.get(t, ("absent", ""))[0], o, text[-3000:]) for t, (o, text) in ivralo.items()}
    differ = {t: d for t, d in differ.items() if d[0] != d[1]}
    assert set(ivralo) == set(plain) and not differ, differ


# Last: it ran beside the suites above, started with this module (nbclient_running).
# nbclient's tests that write outside the kernel's working directory (tests/files): refused by design.
NBCLIENT_WRITES_OUTSIDE = {
    # "Parallel Execute A/B.ipynb" write test_file_{A,B}.txt into $NBEXECUTE_TEST_PARALLEL_TMPDIR (pytest's tmpdir)
    "tests.test_client::test_async_parallel_notebooks": "failed",
}
# The same two notebooks run in threads that the test joins with a 2 s timeout and then leaves: the
# refusal's CellExecutionError reaches pytest in whichever phase runs when the thread ends (the
# call: "failed"; the teardown: "error", seen in CI under load; or a later test). Its outcome says
# how fast the kernels started, not what they did, so it is not run; its async twin above is.
NBCLIENT_RACES_ITS_THREAD = ("tests/test_client.py::test_parallel_notebooks",)
SUITE_TMP = "suite-tmp"  # the suite's --basetemp: where the refused files would have landed


@pytest.mark.timeout(600)
def test_nbclient_suite(nbclient_running: RunningSuite) -> None:
    """nbclient's whole suite; its notebooks and tests name the kernels ``python3`` and ``python``."""
    outcomes = nbclient_running.finish(timeout=540)
    assert len(outcomes) == 127 - len(NBCLIENT_RACES_ITS_THREAD), sorted(outcomes)
    # The text of every test whose outcome is not the expected one.
    assert not_passed(outcomes) == NBCLIENT_WRITES_OUTSIDE, {
        t: (o, text[-3000:]) for t, (o, text) in outcomes.items() if o != NBCLIENT_WRITES_OUTSIDE.get(t, "passed")
    }
    for test in NBCLIENT_WRITES_OUTSIDE:
        text = outcomes[test][1]
        assert "ivralo write guard" in text and "outside the workspace" in text, text[-3000:]
    # Judged from outside the kernel too: no notebook's file landed in the suite's temporary folders.
    assert sorted((nbclient_running.root.parent / SUITE_TMP).rglob("test_file_*.txt")) == []
