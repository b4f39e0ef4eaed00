"""Shared fixtures: isolated Jupyter folders, the ivralo kernelspec, and a leak check.

The pytest process makes itself a child subreaper, so every process a test starts (even a
``setsid`` daemon whose parent died) stays a descendant of pytest; at the end of the session any
descendant still alive fails the run, and is killed by pid.

Tests marked ``fast`` (``make test-fast``) start no process at all, no kernel above all: while one
runs, a process start from Python fails it, and so does a new descendant of pytest still alive at
its end (found by pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import leftovers
import psutil
import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

pytest_plugins = ("postgres",)  # tests/postgres.py: the pg_url fixture (a throwaway PostgreSQL server)

PR_SET_CHILD_SUBREAPER = 36
# Jupyter's (and IPython's, ivralo's, matplotlib's) folders, each moved under a private base.
ISOLATED_DIRS = (
    ("JUPYTER_CONFIG_DIR", "config"),
    ("JUPYTER_DATA_DIR", "data"),
    ("JUPYTER_RUNTIME_DIR", "runtime"),
    ("IPYTHONDIR", "ipython"),
    ("IVRALO_CONFIG_HOME", "ivralo-config"),
    ("MPLCONFIGDIR", "mpl"),
)
SANDBOXED_KERNEL = "ivralo-sandboxed"
FALLBACK_KERNEL = "ivralo-fallback"
CREDENTIAL_NAMES = ("IVRALO_TEST_API_KEY", "IVRALO_TEST_DB_PASSWORD", "SLACK_WEBHOOK_URL")


def pytest_configure(config: pytest.Config) -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # Isolate Jupyter's folders before anything imports jupyter_core: nothing lands in $HOME.
    base = Path(tempfile.mkdtemp(prefix="ivralo-tests-"))
    config._ivralo_base = base  # type: ignore[attr-defined]
    for var, sub in ISOLATED_DIRS:
        (base / sub).mkdir()
        os.environ[var] = str(base / sub)
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
    # The kernelspec under test: installed fresh from this checkout into a private prefix.
    from ivralo_kernel.cli.install import install

    install(prefix=str(base / "prefix"))
    install(prefix=str(base / "prefix"), surface="hermetic")  # ivralo-hermetic
    # The same kernel in its OS sandbox (bubblewrap): a start without it fails instead of falling back.
    install(
        prefix=str(base / "prefix"),
        name=SANDBOXED_KERNEL,
        display_name="Python (ivralo, sandboxed)",
        provisioner_config={"sandbox": "required"},
    )
    # And without it, forced: the fallback mode, whose tests assert exactly what it stops.
    install(
        prefix=str(base / "prefix"),
        name=FALLBACK_KERNEL,
        display_name="Python (ivralo, no sandbox)",
        provisioner_config={"sandbox": "off"},
    )
    os.environ["JUPYTER_PATH"] = str(base / "prefix" / "share" / "jupyter")


def pytest_unconfigure(config: pytest.Config) -> None:
    base = getattr(config, "_ivralo_base", None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ours(proc: psutil.Process) -> bool:
    """Alive and in pytest's session: what this process forked (however: the audit hook sees only
    Python's starts). A kernel's tree runs in sessions of its own, and its processes that appear while
    a fast test runs (an earlier test's kernel at work, or an orphan of it reparented to pytest, the
    subreaper) are not the fast test's."""
    try:
        return _alive(proc) and os.getsid(proc.pid) == os.getsid(0)
    except OSError:
        return False


def _named(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} ({' '.join(proc.cmdline())[:120]}; parent {proc.ppid()})"
    except psutil.Error:
        return str(proc.pid)


def reap_zombies() -> None:
    """Collect exited children (orphans reparented to pytest end up here as zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    before_cgroups = kernel_cgroups()
    before_folders = set(leftovers.ivralo_folders())
    yield
    deadline = time.monotonic() + 5
    while True:
        reap_zombies()
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and _alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    described = []
    for proc in left:
        try:
            described.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    reap_zombies()
    assert not described, "processes left behind by the tests:\n" + "\n".join(described)
    cgroups = _cgroups_left(before_cgroups)
    assert not cgroups, "kernels' memory cgroups left behind by the tests:\n" + "\n".join(cgroups)
    # This process's hosts removed every folder they made (a killed host's are the next start's to sweep).
    folders = [str(f) for f in leftovers.folders_of(os.getpid()) if f not in before_folders]
    assert not folders, "folders this run's hosts made and never removed:\n" + "\n".join(folders)


def kernel_cgroups() -> set[str]:
    """The kernels' memory cgroups (host/sandbox/memory_cgroup.py) where this host makes them (a
    delegated cgroup v2); none elsewhere, where nothing is made and nothing is looked at."""
    from ivralo_kernel.host.sandbox.memory_cgroup import PREFIX, find_place

    parent = find_place().parent
    if not parent:
        return set()
    try:
        return {os.path.join(parent, name) for name in os.listdir(parent) if name.startswith(PREFIX)}
    except OSError:
        return set()


def _cgroups_left(before: set[str]) -> list[str]:
    """Kernel cgroups made during this run that are still there: made by this process, or by a host
    that is gone (a CLI, a server the tests ran); each is removed after it is named."""
    from ivralo_kernel.host.sandbox.memory_cgroup import PREFIX

    left = []
    for path in sorted(kernel_cgroups() - before):
        pid = os.path.basename(path)[len(PREFIX) :].split("-")[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not psutil.pid_exists(int(pid))):
            left.append(path)
            with contextlib.suppress(OSError):
                os.rmdir(path)
    return left


# The audit events of CPython's process starts (subprocess, os.fork/forkpty/posix_spawn/spawn*/exec*/system).
PROCESS_START_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system"}
)


class FastTierWatch:
    """Records process starts while a fast test runs (an audit hook cannot be removed, so it stays
    installed once added and does nothing while ``starts`` is None)."""

    def __init__(self) -> None:
        self.starts: list[str] | None = None
        self.installed = False

    def hook(self, event: str, args: tuple[object, ...]) -> None:
        if self.starts is not None and event in PROCESS_START_EVENTS:
            self.starts.append(f"{event} {args[:2]!r}"[:200])
            raise RuntimeError(f"a test marked fast started a process ({event}): it belongs to the kernel tier")


FAST_TIER = FastTierWatch()


@pytest.fixture(autouse=True)
def fast_tier_starts_no_process(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    if not FAST_TIER.installed:
        sys.addaudithook(FAST_TIER.hook)
        FAST_TIER.installed = True
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    FAST_TIER.starts = starts = []
    try:
        yield
    finally:
        FAST_TIER.starts = None
    new = [_named(p) for p in psutil.Process().children(recursive=True) if p.pid not in before and _ours(p)]
    if starts or new:
        pytest.fail(f"a test marked fast started processes: {starts}; new descendants: {new}")


@pytest.fixture(autouse=True)
def no_credentials_in_host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from a known environment (tests that need credentials set them)."""
    for name in CREDENTIAL_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def km(workspace: Path) -> Iterator[KernelManager]:
    """An ivralo kernel started the way ``jupyter console`` starts one (provisioner attached)."""
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(workspace))
    yield manager
    if manager.has_kernel:
        manager.shutdown_kernel(now=True)


@pytest.fixture
def kc(km: KernelManager) -> Iterator[BlockingKernelClient]:
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    yield client
    client.stop_channels()


def kill_tree(pid: int) -> None:
    """A helper process and everything under it, each by pid (pytest, a subreaper, collects the orphans)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` under a monotonic deadline; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def kernel_in_tree(root: int) -> int:
    """The kernel process under ``root`` (a launched supervisor), by this machine's pid: in the
    sandbox the kernel has a pid namespace of its own, so its ``os.getpid()`` means nothing here."""
    for process in psutil.Process(root).children(recursive=True):
        if "ivralo_kernel.kernel" in process.cmdline():
            return process.pid
    raise AssertionError(f"no kernel process under pid {root}")


def gone(pid: int) -> bool:
    """Not running: exited, or a zombie waiting for its parent (pytest, as subreaper)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


PYTHON = sys.executable


async def wait_until_async(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """``wait_until`` for async tests: yields to the event loop (a pool's sweep runs there)."""
    import asyncio

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
