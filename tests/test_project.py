"""The project surface (issue 15, Musts 2 and 6): the project's interpreter (uv's .venv, Poetry's
environment, a .venv or venv, else python3 on PATH: the first match wins, and the choice is reported),
the kernel running in it with ivralo's packages after its own, ``install --project``, and
``Session.run_tests`` on either surface."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager
from kernel_helpers import execute

from ivralo_kernel.cli.app import main
from ivralo_kernel.host import ConfigError, Session, WorkerConfig, WorkerPool
from ivralo_kernel.host.agent.test_runs import MARKER, run_report
from ivralo_kernel.host.jupyter.interpreters import (
    Interpreter,
    InterpreterError,
    discover,
    install_command,
    launch_for,
    private_path,
    probe,
)
from ivralo_kernel.host.jupyter.kernelspec import kernel_spec_dict
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.bootstrap import BOOTSTRAP, module_argv
from ivralo_kernel.protocol.trust import set_trust

fast = pytest.mark.fast


def fake_venv(folder: Path, uv: str | None = None) -> Path:
    """A venv's shape without starting a process: bin/python (a link to this interpreter), pyvenv.cfg."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "python").symlink_to(sys.executable)
    cfg = f"home = {Path(sys.executable).parent}\ninclude-system-site-packages = false\n"
    cfg += "version = 3.11\n" + (f"uv = {uv}\n" if uv else "")
    (folder / "pyvenv.cfg").write_text(cfg)
    return folder / "bin" / "python"


def conda_env(prefix: Path) -> Path:
    """A conda environment's shape, as conda and pixi make one: conda-meta/ with the python package's
    record, bin/python (a copy of this Python's small launcher binary, so that its prefix is this folder),
    its own lib/pythonX.Y (links to this Python's standard library) with its own, empty site-packages,
    and no pyvenv.cfg. The machine running the tests has no conda."""
    base = Path(sys.base_prefix)
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (prefix / "conda-meta").mkdir(parents=True)
    version = ".".join(map(str, sys.version_info[:3]))
    record = {"name": "python", "version": version, "build": "h0_cpython"}
    (prefix / "conda-meta" / f"python-{version}-h0_cpython.json").write_text(json.dumps(record))
    (prefix / "bin").mkdir()
    shutil.copy2(os.path.realpath(sys._base_executable), prefix / "bin" / minor)
    (prefix / "bin" / "python").symlink_to(minor)
    stdlib = prefix / "lib" / minor
    (stdlib / "site-packages").mkdir(parents=True)
    for entry in (base / "lib" / minor).iterdir():
        if entry.name != "site-packages":
            (stdlib / entry.name).symlink_to(entry)
    for lib in (base / "lib").glob("libpython*"):  # a shared build's launcher finds it next to its lib/
        (prefix / "lib" / lib.name).symlink_to(lib)
    return prefix / "bin" / "python"


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def real_venv(folder: Path, uv: str | None = "0.4.0") -> Path:
    """A real venv (``--without-pip``: no ivralo, no ipykernel, no pytest in it), uv's if ``uv``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    if uv:
        with open(folder / "pyvenv.cfg", "a", encoding="utf-8") as f:
            f.write(f"uv = {uv}\n")
    return folder / "bin" / "python"


# ---- discovery: which interpreter, and why (no process: fast) ------------------------------------


@fast
def test_discovery_order(tmp_path: Path) -> None:
    empty_path = str(tmp_path / "no-bin")  # nothing on PATH: no poetry, no python3
    # A uv project: its .venv says uv made it. It wins over a venv folder next to it.
    uv = tmp_path / "uv-project"
    python = fake_venv(uv / ".venv", uv="0.4.0")
    fake_venv(uv / "venv")
    assert discover(uv, path=empty_path) == Interpreter(str(python), "uv", "uv project (.venv, uv 0.4.0)")
    # A plain venv folder.
    plain = tmp_path / "plain"
    python = fake_venv(plain / "venv")
    assert discover(plain, path=empty_path) == Interpreter(str(python), "venv", "virtual environment (venv)")
    # A .venv that uv did not make: a plain virtual environment, before venv.
    dot = tmp_path / "dot"
    python = fake_venv(dot / ".venv")
    fake_venv(dot / "venv")
    assert discover(dot, path=empty_path).reason == "virtual environment (.venv)"
    # A Poetry project without poetry on PATH: said, and the next match wins.
    (dot / "pyproject.toml").write_text('[tool.poetry]\nname = "x"\n')
    found = discover(dot, path=empty_path)
    assert found.python == str(python)
    assert found.reason == "virtual environment (.venv); pyproject.toml has [tool.poetry] but poetry is not on PATH"
    # Nothing in the folder: python3 on PATH.
    bare = tmp_path / "bare"
    bare.mkdir()
    python3 = tmp_path / "bin" / "python3"
    python3.parent.mkdir()
    python3.symlink_to(sys.executable)
    no_conda: dict[str, str] = {}  # whatever conda environment this run's shell has active
    found = discover(bare, path=str(python3.parent), environ=no_conda)
    assert found == Interpreter(str(python3), "path", f"python3 on PATH ({python3})")
    with pytest.raises(InterpreterError, match="no python3 on PATH"):
        discover(bare, path=empty_path, environ=no_conda)
    with pytest.raises(InterpreterError, match="no such folder"):
        discover(tmp_path / "missing")


@fast
def test_pixi_and_conda_environments_are_found(tmp_path: Path) -> None:
    """Issue 31, Must 3: pixi's default environment, a conda environment in the project's usual
    folders, then the active CONDA_PREFIX; a folder without conda-meta/ is not one."""
    empty_path, no_conda = str(tmp_path / "no-bin"), {}
    pixi = tmp_path / "pixi-project"
    python = script(pixi / ".pixi" / "envs" / "default" / "bin" / "python", "exit 1")
    (pixi / ".pixi" / "envs" / "default" / "conda-meta").mkdir()
    fake_venv(pixi / "venv")  # pixi's environment wins over a plain venv next to it
    expected = Interpreter(str(python), "pixi", "pixi project (.pixi/envs/default)")
    assert discover(pixi, path=empty_path, environ=no_conda) == expected
    assert install_command(expected, "ivralo-kernel") == f"pixi add --pypi ivralo-kernel (in {pixi})"
    uv = tmp_path / "uv-project"  # a uv project's .venv wins over pixi's
    fake_venv(uv / ".venv", uv="0.4.0")
    shutil.copytree(pixi / ".pixi", uv / ".pixi", symlinks=True)
    assert discover(uv, path=empty_path, environ=no_conda).kind == "uv"
    for name in (".conda", "envs", "env"):
        project = tmp_path / f"conda{name}"
        python = script(project / name / "bin" / "python", "exit 1")
        (project / name / "conda-meta").mkdir()
        reason = f"conda environment of the project ({name})"
        assert discover(project, path=empty_path, environ=no_conda) == Interpreter(str(python), "conda", reason)
    active = tmp_path / "miniconda" / "envs" / "work"
    python = script(active / "bin" / "python", "exit 1")
    not_conda = tmp_path / "no-meta"
    script(not_conda / "env" / "bin" / "python", "exit 1")  # no conda-meta/: neither the project's nor active
    environ = {"CONDA_PREFIX": str(not_conda / "env")}
    with pytest.raises(InterpreterError, match="no active conda environment, and no python3 on PATH"):
        discover(not_conda, path=empty_path, environ=environ)
    (active / "conda-meta").mkdir()
    found = discover(not_conda, path=empty_path, environ={"CONDA_PREFIX": str(active)})
    assert found == Interpreter(str(python), "conda", f"active conda environment (CONDA_PREFIX={active})")
    assert discover(pixi, path=empty_path, environ={"CONDA_PREFIX": str(active)}).kind == "pixi"
    # Read from its files, never run on the host (the scripts above would exit 1): conda-meta's record.
    conda = conda_env(tmp_path / "real-shape")
    version = ".".join(map(str, sys.version_info[:3]))
    assert probe(Interpreter(str(conda), "conda", "x")) == (version, frozenset(), {})
    for record in (tmp_path / "real-shape" / "conda-meta").glob("python-*.json"):
        record.unlink()
    with pytest.raises(InterpreterError, match="its conda-meta/ has no record of the python package"):
        probe(Interpreter(str(conda), "conda", "x"))


@fast
def test_private_path_comes_after_the_project_packages() -> None:
    """The bootstrap appends (never PYTHONPATH, which goes first); every hop builds the same command."""
    assert module_argv("/p/python", "m", ["-f", "x"], private_path=False) == [
        "/p/python",
        "-P",
        "-B",
        "-m",
        "m",
        "-f",
        "x",
    ]
    argv = module_argv("/p/python", "m", ["-f", "x"], env={names.ENV_CODE_PATH: "/a:/b"})
    assert argv == ["/p/python", "-P", "-B", "-c", BOOTSTRAP, "m", "-f", "x"]
    assert "sys.path+=" in BOOTSTRAP and "PYTHONPATH" not in BOOTSTRAP
    spec = kernel_spec_dict(python="/p/python", env={names.ENV_CODE_PATH: "/a"})
    assert spec["argv"][3:6] == ["-c", BOOTSTRAP, "ivralo_kernel.supervisor"]
    assert kernel_spec_dict(python="/p/python")["argv"][3:5] == ["-m", "ivralo_kernel.supervisor"]
    import ivralo_kernel

    assert private_path()[0] == str(Path(ivralo_kernel.__file__).resolve().parents[1])


@fast
def test_project_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^project: the hermetic surface sees"):
        WorkerConfig(project=str(tmp_path), surface="hermetic")
    with pytest.raises(ConfigError, match=r"^python: and project="):
        WorkerPool(tmp_path, config=WorkerConfig(project=str(tmp_path)), python=sys.executable)
    with pytest.raises(ConfigError, match="project"):
        Session(pool=WorkerPool(tmp_path), project=tmp_path)
    session = Session(project=tmp_path)  # the project is the workspace unless one is given
    assert session.workspace == str(tmp_path.resolve()) and session.config.project == str(tmp_path)


@fast
def test_report_parsing() -> None:
    counts = {"passed": 2, "failed": 0, "errors": 0, "skipped": 1, "exit_code": 0}
    report = run_report("project", f"..\n{MARKER}{json.dumps(counts)}\n")
    assert report == {
        "runner": "project",
        "status": "passed",
        "passed": 2,
        "failed": 0,
        "errors": 0,
        "skipped": 1,
        "output": "..\n",
    }
    missing = {**counts, "errors": 1, "missing_modules": [{"file": "t.py", "module": "numpy", "message": ""}]}
    report = run_report("hermetic", f"{MARKER}{json.dumps(missing)}\n")
    assert report["status"] == "error" and 'runner="project"' in report["error"] and "numpy" in report["error"]
    lost = run_report("project", {"status": "error", "result": "", "error": "timeout: execution exceeded"})
    assert lost["status"] == "error" and lost["error"] == "timeout: execution exceeded"


# ---- with processes: Poetry's answer, the probe, a kernel in the project's interpreter --------


def test_poetry_project(tmp_path: Path) -> None:
    """``poetry env info -p`` (a stub on PATH) names the environment; a failing Poetry is said."""
    env = tmp_path / "cache" / "virtualenvs" / "demo-py3.11"
    python = fake_venv(env)
    project = tmp_path / "demo"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.poetry]\nname = "demo"\n')
    fake_venv(project / "venv")  # a later match: Poetry's environment wins
    bin_dir = tmp_path / "bin"
    script(bin_dir / "poetry", f'[ "$1 $2 $3" = "env info -p" ] && echo {env}')
    found = discover(project, path=str(bin_dir))
    assert found == Interpreter(str(python), "poetry", f"Poetry project (poetry env info -p: {env})")
    script(bin_dir / "poetry", "exit 1")  # no environment yet
    found = discover(project, path=str(bin_dir))
    assert found.kind == "venv"
    assert "Poetry has no environment for it yet (poetry install makes one)" in found.reason


def test_another_python_minor_without_ivralo_is_a_clear_error(tmp_path: Path) -> None:
    python = script(tmp_path / "bin" / "python", """echo '{"version": "3.99.1", "found": ["pytest"]}'""")
    with pytest.raises(InterpreterError) as caught:
        launch_for(Interpreter(str(python), "uv", "uv project (.venv, uv 0.4.0)"))
    message = str(caught.value)
    assert "has no ipykernel and no ivralo_kernel" in message
    assert f"Python 3.99.1 while ivralo's own packages are built for Python {sys.version_info[0]}." in message
    assert message.endswith(f"Install ivralo-kernel there: uv pip install --python {python} ivralo-kernel")


def test_a_project_copy_of_another_major_is_a_clear_error(tmp_path: Path) -> None:
    """The project's packages come first: its IPython 1.x would sit under ivralo's ipykernel."""
    from importlib.metadata import version

    same = ".".join(map(str, sys.version_info[:3]))
    report = json.dumps(
        {"version": same, "found": [], "dists": {"ipython": "1.0.0", "traitlets": version("traitlets")}}
    )
    python = script(tmp_path / "bin" / "python", f"echo '{report}'")
    with pytest.raises(InterpreterError) as caught:
        launch_for(Interpreter(str(python), "venv", "virtual environment (.venv)"))
    message = str(caught.value)
    assert f"has ipython 1.0.0 (ivralo's: {version('ipython')}): its own copies come before ivralo's" in message
    assert "traitlets" not in message
    assert message.endswith(f"(it brings versions that fit): {python} -m pip install ivralo-kernel")


async def test_a_kernel_in_the_projects_interpreter(tmp_path: Path) -> None:
    """A uv project whose .venv has neither ivralo nor ipykernel: the kernel runs its interpreter, in
    the sandbox, with ivralo's packages after the project's own; kernel_info says which and why."""
    project = tmp_path / "proj"
    python = real_venv(project / ".venv")
    site = next((project / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "projectlib.py").write_text("WHERE = 'project'\n")
    # A module ipykernel installs too (never imported by the kernel itself): the project's copy wins.
    (site / "ipykernel_launcher.py").write_text("WHERE = 'project'\n")
    (project / "tests").mkdir()
    (project / "tests" / "test_pure.py").write_text(
        "import json\n\ndef test_ok():\n    assert json.loads('[1]') == [1]\n\n"
        "def test_bad():\n    assert 1 == 2\n\nclass TestThing:\n    def test_method(self):\n        pass\n"
        "\n    def test_fixture(self, tmp_path):\n        pass\n"
    )
    (project / "tests" / "test_needs_numpy.py").write_text("import numpy\n\ndef test_np():\n    assert numpy\n")
    set_trust(str(project), True, os.environ)
    async with Session(project=project, surface="project") as s:
        code = "import sys, projectlib, ipykernel, ipykernel_launcher\nprint(sys.executable)\n"
        code += "print(projectlib.WHERE, ipykernel_launcher.WHERE, ipykernel.__file__.startswith(sys.prefix))"
        assert await s.run(code) == f"{python}\nproject project False\n"
        # Nothing else of ivralo's environment (requests and jupyterlab are in it, not in the project),
        # as under `uv run`: neither its modules nor its distributions' metadata.
        for module in ("requests", "jupyterlab"):
            leaked = await s.run(f"import {module}")
            assert isinstance(leaked, dict) and f"No module named '{module}'" in leaked["error"], leaked
        code = "import importlib.metadata as _md\nprint(sorted({d.metadata['Name'] for d in _md.distributions()}"
        code += " & {'ipykernel', 'ivralo-kernel', 'requests', 'jupyterlab'}), _md.version('traitlets') > '5')\ndel _md"
        assert await s.run(code) == "['ipykernel', 'ivralo-kernel'] True\n"
        section = s.kernel_info["ivralo"]
        assert section["interpreter"]["python"] == str(python)
        choice = f"{python} (Python {'.'.join(map(str, sys.version_info[:3]))}; uv project (.venv, uv 0.4.0); "
        assert section["interpreter"]["choice"] == choice + "ivralo's packages from a private path after its own)"
        assert section["layers"]["sandbox"].startswith("bwrap")
        assert section["layers"]["write_guard"] == "audit hook"  # ivralo's guards, without ipykernel there
        assert isinstance(await s.run("open('/etc/ivralo-denied', 'w')"), dict)
        assert await s.interpreter() == section["interpreter"]["choice"]

        # Tests: the hermetic runner (the standard library; a third-party import is said, with the way out),
        hermetic = await s.run_tests("tests", runner="hermetic")
        assert (hermetic["passed"], hermetic["failed"], hermetic["errors"], hermetic["skipped"]) == (2, 1, 1, 1)
        assert hermetic["status"] == "error"
        assert hermetic["error"].startswith("the hermetic run stopped at an import of numpy")
        assert hermetic["error"].endswith('Run these tests on the project surface: run_tests(path, runner="project")')
        assert "FAILED tests/test_pure.py::test_bad" in hermetic["output"]
        assert "needs pytest fixtures (tmp_path): run it with runner='project'" in hermetic["output"]
        # and the project runner, which needs pytest in the project itself.
        project_run = await s.run_tests("tests/test_pure.py", runner="project")
        assert project_run["status"] == "error"
        assert project_run["error"].endswith(f"Install it there: uv pip install --python {python} pytest")
        # The runs left it as it was.
        assert await s.list_vars() == ["ipykernel", "ipykernel_launcher", "projectlib", "sys"]

        # Issue 31, Must 1: %pip in a uv project, whose .venv has no pip. With no uv binary found (this
        # kernel's PATH and home made empty, by a cell), one sentence says what to run instead;
        nothing = project / "nothing"
        nothing.mkdir()
        cell = f"import os\nhome = os.environ['HOME']\nos.environ.update(PATH={str(nothing)!r}, HOME={str(nothing)!r})"
        await s.run(cell + "\nos.environ.pop('XDG_BIN_HOME', None)")
        refused = await s.run("%pip install six")
        assert isinstance(refused, dict) and "No module named pip" not in str(refused)
        assert f"{project / '.venv'}), which has no pip, and no uv binary is on this kernel's PATH" in refused["error"]
        assert "so run `uv add six` in a terminal in the project" in refused["error"]
        # with one (a stand-in that records its arguments: the test machine has no uv, and no index is
        # reachable), %pip runs `uv pip ... --python <the project's python>`, and %uv runs uv.
        record = project / "uv-argv"
        script(project / "uv-bin" / "uv", f'printf "%s\\n" "$@" "cache=$UV_CACHE_DIR" > {record}\necho stand-in uv ran')
        cell = f"os.environ.update(PATH={str(project / 'uv-bin')!r} + ':/usr/bin:/bin', HOME=home)\n"
        cache = "cache="  # uv's default cache: under XDG_CACHE_HOME, which the kernel has its own of
        assert (await s.run(cell + "%pip install six")).strip() == "stand-in uv ran"  # a pty's \r\n
        assert record.read_text().splitlines() == ["pip", "install", "--python", str(python), "six", cache]
        cell = "os.environ['UV_CACHE_DIR'] = home + '/.cache/uv'\n"  # one the sandbox keeps read-only
        assert (await s.run(cell + "%uv pip list")).strip() == "stand-in uv ran"
        *argv, cache = record.read_text().splitlines()
        assert argv == ["pip", "list", "--python", str(python)] and cache.endswith("/ivralo-uv-cache")
        record.unlink()
        outside = await s.run("%uv pip install --target /etc/ivralo-denied six")  # %pip's workspace check
        assert isinstance(outside, dict) and not record.exists()
        assert "%uv pip install would write to /etc/ivralo-denied, outside the workspace" in outside["error"]
        assert f"(uv pip install --python {python} --target /etc/ivralo-denied six)" in outside["error"]


async def test_a_kernel_in_a_pixi_environment(tmp_path: Path) -> None:
    """Issue 31, Must 3: a pixi project's conda environment (its own prefix and site-packages, no
    pyvenv.cfg) runs the kernel, with the project's packages and ivralo's after them."""
    project = tmp_path / "pixi-proj"
    python = conda_env(project / ".pixi" / "envs" / "default")
    site = next((project / ".pixi" / "envs" / "default" / "lib").glob("python3*/site-packages"))
    (site / "projectlib.py").write_text("WHERE = 'pixi'\n")
    set_trust(str(project), True, os.environ)
    async with Session(project=project, surface="project") as s:
        code = "import sys, projectlib\nprint(sys.executable)\nprint(sys.prefix)\nprint(projectlib.WHERE)"
        assert await s.run(code) == f"{python}\n{python.parent.parent}\npixi\n"
        section = s.kernel_info["ivralo"]
        choice = f"{python} (Python {'.'.join(map(str, sys.version_info[:3]))}; pixi project (.pixi/envs/default); "
        assert section["interpreter"]["choice"] == choice + "ivralo's packages from a private path after its own)"
        assert isinstance(await s.run("open('/etc/ivralo-denied', 'w')"), dict)  # the same guards


async def test_project_runner_runs_pytest(workspace: Path) -> None:
    """In an interpreter that has pytest (ivralo's own here), pytest's own counts and output."""
    (workspace / "test_one.py").write_text("def test_a():\n    assert True\n\ndef test_b():\n    assert 2 == 3\n")
    set_trust(str(workspace), True, os.environ)
    async with Session(workspace=workspace, python=sys.executable) as s:
        report = await s.run_tests("test_one.py", runner="project", args=("-q",))
    assert (report["status"], report["passed"], report["failed"]) == ("failed", 1, 1), report
    assert "assert 2 == 3" in report["output"]


def test_install_project_spec(tmp_path: Path, workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``install --project``: a spec named after the folder whose argv runs the project's interpreter,
    started here by jupyter_client as any Jupyter host would."""
    project = tmp_path / "My Project"
    python = fake_venv(project / "venv")  # its own pyvenv.cfg: none of ivralo's packages, the private path
    prefix = tmp_path / "prefix"
    assert main(["install", "--project", str(project), "--prefix", str(prefix)]) == 0
    printed = capsys.readouterr().out
    assert "Installed kernelspec ivralo-my-project" in printed
    assert f"interpreter: {python} (Python" in printed and "virtual environment (venv); ivralo's packages" in printed
    spec_dir = prefix / "share" / "jupyter" / "kernels" / "ivralo-my-project"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["argv"][:6] == [str(python), "-P", "-B", "-c", BOOTSTRAP, "ivralo_kernel.supervisor"]
    assert spec["env"][names.ENV_CODE_PATH] == os.pathsep.join(private_path())
    assert spec["display_name"] == "Python (ivralo, My Project)"
    from jupyter_client.kernelspec import KernelSpecManager

    km = KernelManager(
        kernel_name="ivralo-my-project", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_dir.parent)])
    )
    km.start_kernel(cwd=str(workspace))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        assert execute(kc, "import sys\nprint(sys.executable)").stdout == f"{python}\n"
        info = kc.kernel_info(reply=True)["content"]["ivralo"]["interpreter"]
        assert info["python"] == str(python) and "virtual environment (venv)" in info["choice"]
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    assert main(["install", "--project", str(project), "--python", sys.executable, "--prefix", str(prefix)]) == 2


@fast
def test_a_workspace_venv_is_read_never_run_on_the_host(tmp_path: Path) -> None:
    """Code in a kernel can write a venv in its workspace: the host learns what it needs from the
    venv's files, and runs nothing of it (its python, a .pth line) outside the sandbox."""
    venv, marker = tmp_path / "proj" / ".venv", tmp_path / "ran-on-the-host"
    python = script(venv / "bin" / "python", f"touch {marker}")  # what a planted interpreter would do
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n")
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "ipykernel-7.4.0.dist-info").mkdir(parents=True)
    metadata = "Metadata-Version: 2.1\nName: ipykernel\nVersion: 7.4.0\n"
    (site / "ipykernel-7.4.0.dist-info" / "METADATA").write_text(metadata)
    (site / "evil.pth").write_text(f"import os; os.system('touch {marker}')\n")
    version, found, dists = probe(Interpreter(str(python), "venv", "virtual environment (.venv)"))
    assert (version, found, dists) == ("3.11.7", frozenset({"ipykernel"}), {"ipykernel": "7.4.0"})
    assert not marker.exists(), "the host ran the workspace's interpreter"
