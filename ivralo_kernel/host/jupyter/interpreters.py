"""[host] Which Python a project's kernel runs, and how: the project surface's interpreter discovery.

For a project folder, the first match wins:

1. a uv project: ``.venv/pyvenv.cfg`` has the ``uv = <version>`` key uv writes → ``.venv/bin/python``;
2. a Poetry project: ``pyproject.toml`` has ``[tool.poetry]`` and ``poetry`` is on PATH →
   ``$(poetry env info -p)/bin/python`` (bounded: Poetry may be slow, never the kernel's start);
3. a pixi project: ``.pixi/envs/default/bin/python`` (pixi's default environment, a conda one);
4. a ``.venv`` or ``venv`` folder with ``bin/python``;
5. a conda environment of the project: ``.conda`` (what VS Code's "Create Environment" makes), ``envs``
   or ``env`` (``conda create --prefix ./envs``) with ``conda-meta/`` and ``bin/python``;
6. the active conda environment (``CONDA_PREFIX``), wherever it is: activating one is choosing it for
   what runs from that shell, and its ``python3`` would come first on PATH anyway; the project's own
   environments above win over it, as ``uv run`` and ``pixi run`` would use them;
7. ``python3`` on PATH.

The interpreter is then checked: its Python version, and whether it has ``ivralo_kernel``,
``ipykernel`` and ``pytest``. A venv's (and a conda environment's, from ``conda-meta/``) are read
from its files, never by running it on the host (code in the kernel can write a venv in the
workspace); ``python3`` on PATH is asked (one short process). One without ivralo (or ipykernel)
still runs the kernel, with ivralo's kernel side (ivralo_kernel, ipykernel and what it needs:
``kernel_closure``, nothing else of ivralo's environment) on a private path after its site-packages
(``protocol.bootstrap``), as long as it is the same Python minor as ivralo's: compiled packages
(pyzmq, psutil) are built for one. Otherwise the error names what is missing and the command that
installs it.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ivralo_kernel.protocol import WorkerBootstrapError, names, scrub

POETRY_TIMEOUT_S = 15.0
PROBE_TIMEOUT_S = 30.0
PACKAGE = "ivralo-kernel"  # what installs ivralo_kernel and ipykernel into an interpreter
_PROBE = (
    "import importlib.util as u,importlib.metadata as md,json,sys\n"
    "def v(d):\n try:\n  return md.version(d)\n except Exception:\n  return None\n"
    "m,d=sys.argv[1].split(','),sys.argv[2].split(',')\n"
    "print(json.dumps({'version':'.'.join(map(str,sys.version_info[:3])),"
    "'found':[x for x in m if u.find_spec(x) is not None],'dists':{x:v(x) for x in d if v(x)}}))"
)
_PROBED = ("ivralo_kernel", "ipykernel", "pytest")
# What the kernel process is made of: a project's own copy comes first on the path, so one of another
# major version than ivralo's breaks the kernel (IPython 8 under ipykernel 7 does).
KERNEL_DISTRIBUTIONS = (
    "ipykernel",
    "ipython",
    "traitlets",
    "jupyter_client",
    "jupyter_core",
    "pyzmq",
    "tornado",
    "comm",
)


class InterpreterError(WorkerBootstrapError):
    """A project's interpreter cannot be found, or cannot run the kernel; says why and the fix."""


@dataclass(frozen=True)
class Interpreter:
    """A discovered interpreter: its path (a venv's own, not resolved: resolving leaves the venv),
    what kind of project chose it (uv, poetry, pixi, venv, conda, path, given, own) and why, in words."""

    python: str
    kind: str
    reason: str


CONDA_FOLDERS = (".conda", "envs", "env")  # a project's own conda environment, where people make one


def discover(
    project: str | os.PathLike[str], path: str | None = None, environ: Mapping[str, str] | None = None
) -> Interpreter:
    """The interpreter of ``project`` (see the module's doc); ``path``: the PATH to search (this one);
    ``environ``: where ``CONDA_PREFIX`` is read (this process's environment)."""
    environ = os.environ if environ is None else environ
    root = Path(project).expanduser().absolute()
    if not root.is_dir():
        raise InterpreterError(f"project={str(project)!r}: no such folder. Give the folder of the project.")
    notes: list[str] = []
    venv = root / ".venv"
    uv = _uv_version(venv)
    if uv is not None and _runs(venv / "bin" / "python"):
        return Interpreter(str(venv / "bin" / "python"), "uv", f"uv project (.venv, uv {uv})")
    if _is_poetry(root):
        poetry = shutil.which("poetry", path=path if path is not None else os.environ.get("PATH"))
        if poetry is None:
            notes.append("pyproject.toml has [tool.poetry] but poetry is not on PATH")
        else:
            found, why = _poetry_env(poetry, root)
            if found is not None:
                return Interpreter(found, "poetry", f"Poetry project (poetry env info -p: {Path(found).parent.parent})")
            notes.append(why)
    pixi = root / ".pixi" / "envs" / "default"
    if _is_conda(pixi):
        return Interpreter(
            str(pixi / "bin" / "python"), "pixi", _with_notes("pixi project (.pixi/envs/default)", notes)
        )
    for name in (".venv", "venv"):
        candidate = root / name / "bin" / "python"
        if _runs(candidate):
            return Interpreter(str(candidate), "venv", _with_notes(f"virtual environment ({name})", notes))
    for name in CONDA_FOLDERS:
        if _is_conda(root / name):
            python = str(root / name / "bin" / "python")
            return Interpreter(python, "conda", _with_notes(f"conda environment of the project ({name})", notes))
    active = environ.get("CONDA_PREFIX", "")
    if active and _is_conda(Path(active)):
        python = str(Path(active) / "bin" / "python")
        return Interpreter(python, "conda", _with_notes(f"active conda environment (CONDA_PREFIX={active})", notes))
    python3 = shutil.which("python3", path=path if path is not None else os.environ.get("PATH"))
    if python3 is None:
        raise InterpreterError(
            f"project={str(root)!r}: no .venv, venv, Poetry, pixi or conda environment there, no active conda "
            "environment, and no python3 on PATH. Create the project's environment (uv sync, poetry install, "
            "pixi install, or python3 -m venv .venv)."
        )
    return Interpreter(python3, "path", _with_notes(f"python3 on PATH ({python3})", notes))


def _with_notes(reason: str, notes: list[str]) -> str:
    return reason if not notes else f"{reason}; {'; '.join(notes)}"


def _runs(python: Path) -> bool:
    return python.is_file() and os.access(python, os.X_OK)


def _is_conda(prefix: Path) -> bool:
    """A conda (or pixi) environment: ``conda-meta/`` (conda's record of what is installed) and a python."""
    return (prefix / "conda-meta").is_dir() and _runs(prefix / "bin" / "python")


def _uv_version(venv: Path) -> str | None:
    """The ``uv`` key of a venv's ``pyvenv.cfg`` (uv writes it; ``python -m venv`` does not)."""
    try:
        text = (venv / "pyvenv.cfg").read_text(encoding="utf-8")
    except OSError:
        return None
    parser = configparser.ConfigParser()
    try:
        parser.read_string("[venv]\n" + text)
    except configparser.Error:
        return None
    return parser["venv"].get("uv")


def _is_poetry(root: Path) -> bool:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False
    tool = data.get("tool")
    return isinstance(tool, dict) and "poetry" in tool


def _poetry_env(poetry: str, root: Path) -> tuple[str | None, str]:
    """(the Poetry environment's python, or None and why not)."""
    try:
        done = subprocess.run(
            [poetry, "env", "info", "-p"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=POETRY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return None, f"poetry env info -p did not answer within {POETRY_TIMEOUT_S:g} s"
    except OSError as exc:
        return None, f"poetry could not run ({exc})"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None, "Poetry has no environment for it yet (poetry install makes one)"
    python = Path(lines[-1].strip()) / "bin" / "python"
    if not _runs(python):
        return None, f"poetry env info -p named {lines[-1].strip()}, which has no bin/python"
    return str(python), ""


# ---- how the kernel runs in it -------------------------------------------------------------------


@dataclass(frozen=True)
class KernelLaunch:
    """The interpreter a kernel runs, with the private path it needs (empty: it has ivralo itself)."""

    interpreter: Interpreter
    version: str
    found: frozenset[str] = field(default_factory=frozenset)
    private_path: tuple[str, ...] = ()

    @property
    def python(self) -> str:
        return self.interpreter.python

    @property
    def description(self) -> str:
        """What kernel_info and doctor report: the interpreter, its version, and why it was chosen."""
        how = "; ivralo's packages from a private path after its own" if self.private_path else ""
        return f"{self.python} (Python {self.version}; {self.interpreter.reason}{how})"

    def env(self) -> dict[str, str]:
        """What the kernel's environment needs for this interpreter (the kernelspec's env)."""
        env = {names.ENV_INTERPRETER: self.description}
        if self.private_path:
            from ivralo_kernel.host.jupyter.kernel_closure import kernel_closure

            closure = kernel_closure()
            env[names.ENV_CODE_PATH] = os.pathsep.join(self.private_path)
            env[names.ENV_CODE_MODULES] = ",".join(closure.modules)
            env[names.ENV_CODE_DISTS] = ",".join(closure.distributions)
        return env

    def install_command(self, package: str) -> str:
        return install_command(self.interpreter, package)


def install_command(interpreter: Interpreter, package: str) -> str:
    """The command that installs ``package`` into ``interpreter`` (a uv venv has no pip)."""
    if interpreter.kind == "uv":
        return f"uv pip install --python {interpreter.python} {package}"
    if interpreter.kind == "pixi":  # .pixi/envs/default/bin/python: the project is four folders up
        return f"pixi add --pypi {package} (in {Path(interpreter.python).parents[4]})"
    return f"{interpreter.python} -m pip install {package}"


def own_launch() -> KernelLaunch:
    """ivralo's own interpreter (no process started)."""
    found = frozenset(m for m in _PROBED if _has_module(m))
    version = ".".join(map(str, sys.version_info[:3]))
    return KernelLaunch(Interpreter(sys.executable, "own", "ivralo's own interpreter"), version, found)


def _has_module(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _site_dists(folders: list[Path]) -> tuple[frozenset[str], dict[str, str]]:
    """(which of ``_PROBED`` these site-packages folders hold, their ``KERNEL_DISTRIBUTIONS``' versions)."""
    import importlib.metadata

    dists: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[str(f) for f in folders if f.is_dir()]):
        name = dist.metadata["Name"] or ""
        dists.setdefault(_norm(name), dist.version)
    found = frozenset(m for m in _PROBED if _norm(m) in dists or _norm(m.replace("_", "-")) in dists)
    kernel = {d: dists[_norm(d)] for d in KERNEL_DISTRIBUTIONS if _norm(d) in dists}
    return found, kernel


def read_conda(python: str) -> tuple[str, frozenset[str], dict[str, str]] | None:
    """``read_venv`` for a conda (or pixi) environment: its Python version from ``conda-meta``'s record
    of the python package, its packages from its site-packages; None when ``python`` is not one's.
    Never run on the host either: a project's environment is in the workspace."""
    root = Path(python).absolute().parent.parent
    meta = root / "conda-meta"
    if not meta.is_dir():
        return None
    version = ""
    for record in sorted(meta.glob("python-[0-9]*.json")):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("name") == "python" and str(data.get("version", ""))[:1].isdigit():
            version = str(data["version"])
            break
    if not version:
        raise InterpreterError(
            f"{python}: its conda-meta/ has no record of the python package, so its Python version cannot be "
            "checked without running it. Repair the environment (pixi install, or conda install python)."
        )
    minor = ".".join(version.split(".")[:2])
    found, kernel = _site_dists([root / "lib" / f"python{minor}" / "site-packages"])
    return version, found, kernel


def read_venv(python: str) -> tuple[str, frozenset[str], dict[str, str]] | None:
    """What ``probe`` learns, read from a virtual environment's files (``pyvenv.cfg`` and its
    packages' metadata) without running anything of it; None when ``python`` is not a venv's.

    Never run on the host: a venv in the workspace is writable by code in the kernel, and its
    interpreter (or one ``.pth`` line in its site-packages) would run outside the sandbox, with the
    host's credentials in reach. The kernel runs it later, inside the sandbox."""
    root = Path(python).absolute().parent.parent
    try:
        lines = (root / "pyvenv.cfg").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    values = {k.strip().lower(): v.strip() for k, _, v in (line.partition("=") for line in lines) if _}
    version = values.get("version_info") or values.get("version") or ""
    if not version[:1].isdigit():
        raise InterpreterError(
            f"{python}: its pyvenv.cfg names no Python version, so it cannot be checked without running it. "
            "Recreate the project's environment."
        )
    minor = ".".join(version.split(".")[:2])
    folders = [root / "lib" / f"python{minor}" / "site-packages", root / "lib64" / f"python{minor}" / "site-packages"]
    if values.get("include-system-site-packages", "false").lower() == "true" and values.get("home"):
        base = Path(values["home"]).parent
        folders += [base / "lib" / f"python{minor}" / "site-packages", base / "lib" / "python3" / "dist-packages"]
    found, kernel = _site_dists(folders)
    return version, found, kernel


def probe(interpreter: Interpreter) -> tuple[str, frozenset[str], dict[str, str]]:
    """(its Python version, which of ivralo_kernel, ipykernel and pytest it can import by itself, its
    versions of ``KERNEL_DISTRIBUTIONS``). A venv's and a conda environment's are read from their files
    (``read_venv``, ``read_conda``); any
    other interpreter (python3 on PATH) is asked, without the host's credentials in its environment."""
    known = read_venv(interpreter.python) or read_conda(interpreter.python)
    if known is not None:
        return known
    env, _ = scrub({k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")})
    try:
        done = subprocess.run(
            [interpreter.python, "-P", "-c", _PROBE, ",".join(_PROBED), ",".join(KERNEL_DISTRIBUTIONS)],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            env=env,
        )
        report = json.loads(done.stdout.strip().splitlines()[-1])
        return str(report["version"]), frozenset(report["found"]), dict(report.get("dists") or {})
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as exc:
        raise InterpreterError(
            f"{interpreter.python} ({interpreter.reason}) does not run as a Python interpreter ({exc}). "
            "Repair or recreate the project's environment."
        ) from None


def launch_for(interpreter: Interpreter) -> KernelLaunch:
    """How a kernel runs in ``interpreter``, or an ``InterpreterError`` that says what to install."""
    version, found, dists = probe(interpreter)
    if {"ivralo_kernel", "ipykernel"} <= found:
        return KernelLaunch(interpreter, version, found)
    missing = [m for m in ("ipykernel", "ivralo_kernel") if m not in found]
    own = ".".join(map(str, sys.version_info[:2]))
    if ".".join(version.split(".")[:2]) == own:
        clashes = _clashes(dists)
        if clashes:
            raise InterpreterError(
                f"{interpreter.python} ({interpreter.reason}) has {', '.join(clashes)}: its own copies come before "
                f"ivralo's on the kernel's path, and another major version does not fit the kernel. Install "
                f"ivralo-kernel there (it brings versions that fit): {install_command(interpreter, PACKAGE)}"
            )
        return KernelLaunch(interpreter, version, found, private_path())
    raise InterpreterError(
        f"{interpreter.python} ({interpreter.reason}) has no {' and no '.join(missing)}, and it is Python "
        f"{version} while ivralo's own packages are built for Python {own}, so they cannot stand in. "
        f"Install ivralo-kernel there: {install_command(interpreter, PACKAGE)}"
    )


def _clashes(theirs: dict[str, str]) -> list[str]:
    """The project's kernel distributions whose major version differs from ivralo's ("IPython 8.12.3
    (ivralo's: 9.18.1)")."""
    from importlib import metadata

    out = []
    for name, version in sorted(theirs.items()):
        try:
            mine = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if version.split(".")[0] != mine.split(".")[0]:
            out.append(f"{name} {version} (ivralo's: {mine})")
    return out


def plan(project: str | None, python: str | None = None) -> KernelLaunch:
    """The kernel's interpreter: ``python`` if given, else ``project``'s, else ivralo's own."""
    if python is not None:
        return launch_for(Interpreter(python, "given", "given as python="))
    if project is not None:
        return launch_for(discover(project))
    return own_launch()


def private_path() -> tuple[str, ...]:
    """ivralo's own packages: its checkout (an editable install's code is not in site-packages),
    then the site-packages of ivralo's environment (ipykernel, jupyter_client, pyzmq, ...)."""
    import ivralo_kernel

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(ivralo_kernel.__file__)))]
    paths = sysconfig.get_paths()
    roots += [paths["purelib"], paths["platlib"]]
    return tuple(p for p in dict.fromkeys(roots) if os.path.isdir(p))
