"""[cli] ``ivralo-kernel install``: write the ``ivralo`` kernelspec where Jupyter looks for it, and the
``ivralo-hermetic`` one (the hermetic surface: the standard library and ivralo's helpers only)."""

from __future__ import annotations

import compileall
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager

import ivralo_kernel
from ivralo_kernel.host.jupyter.interpreters import discover, launch_for
from ivralo_kernel.host.jupyter.kernelspec import LOGO_SVG, kernel_spec_dict
from ivralo_kernel.protocol import KernelSpecError, names


def check_python(python: str) -> str:
    """The absolute path of an interpreter that can run the ivralo kernel, or a clear error."""
    path = Path(python).expanduser()
    if not path.is_absolute():
        found = next((Path(d) / python for d in os.get_exec_path() if (Path(d) / python).is_file()), None)
        if found is None:
            raise KernelSpecError(f"--python {python}: no such interpreter on PATH. Give its full path.")
        path = found
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise KernelSpecError(f"--python {path}: not an executable file. Give the path of a Python interpreter.")
    probe = subprocess.run(
        [str(path), "-c", "import ivralo_kernel.supervisor, ipykernel"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if probe.returncode != 0:
        raise KernelSpecError(
            f"--python {path}: this interpreter cannot import ivralo_kernel and ipykernel, so the kernel "
            f"could not start. Install it there first: {path} -m pip install ivralo-kernel"
        )
    # Keep the venv's own path (not the resolved symlink): resolving would leave the venv.
    return str(path.absolute())


def install(
    *,
    user: bool = False,
    prefix: str | None = None,
    name: str | None = None,
    python: str | None = None,
    display_name: str | None = None,
    provisioner_config: dict[str, Any] | None = None,
    surface: str = names.SURFACE_PROJECT,
    project: str | None = None,
) -> str:
    """Install one kernelspec; return the folder it was written to.

    ``provisioner_config`` holds IvraloProvisioner settings (deadline_ms, memory_limit_bytes, ...)
    that every host starting this kernelspec applies; they live in kernel.json, out of the code's reach.
    ``surface`` "hermetic" writes the hermetic surface's spec (by default named ``ivralo-hermetic``).
    ``project``: run the kernel in that project's interpreter (``host.interpreters``; by default named
    ``ivralo-<folder>``).
    """
    if surface not in names.SURFACES:
        raise KernelSpecError(f"--surface {surface}: no such surface. Use one of: {', '.join(names.SURFACES)}.")
    hermetic = surface == names.SURFACE_HERMETIC
    if project is not None:
        if hermetic or python:
            given = "--surface hermetic" if hermetic else "--python"
            raise KernelSpecError(f"--project and {given} both choose the interpreter's packages: give one of them.")
        return _install_project(
            project,
            user=user,
            prefix=prefix,
            name=name,
            display_name=display_name,
            config=dict(provisioner_config or {}),
        )
    name = name or (names.HERMETIC_KERNEL_NAME if hermetic else names.KERNEL_NAME)
    config = dict(provisioner_config or {})
    if hermetic:
        config["surface"] = names.SURFACE_HERMETIC
    interpreter = check_python(python) if python else sys.executable
    default_display = names.HERMETIC_DISPLAY_NAME if hermetic else names.DISPLAY_NAME
    spec = kernel_spec_dict(python=interpreter, display_name=display_name or default_display, provisioner_config=config)
    return _write(spec, name, user=user, prefix=prefix)


def _install_project(
    project: str, *, user: bool, prefix: str | None, name: str | None, display_name: str | None, config: dict[str, Any]
) -> str:
    """A project surface's spec whose argv runs the project's interpreter, the way a Session does."""
    launch = launch_for(discover(project))  # an InterpreterError says what to install, and how
    folder = Path(project).expanduser().absolute().name or "project"
    name = name or f"ivralo-{re.sub(r'[^a-z0-9._-]+', '-', folder.lower()).strip('-') or 'project'}"
    config.pop("surface", None)
    spec = kernel_spec_dict(
        python=launch.python,
        display_name=display_name or f"Python (ivralo, {folder})",
        provisioner_config=config,
        env=launch.env(),
    )
    return _write(spec, name, user=user, prefix=prefix)


def compile_bytecode() -> bool:
    """Compile ivralo's own modules to bytecode, as pip does when it installs a wheel.

    The supervisor and the kernel run with ``-B`` (and ``PYTHONDONTWRITEBYTECODE``), so that nothing
    writes ``__pycache__`` into a workspace; they still read bytecode that exists. From an editable
    install (or any install that skipped it) there is none, and every start compiled each of
    ivralo's modules it imports again: about 50 ms of CPU per start, in the supervisor and the
    kernel. Stale files are recompiled, current ones left alone; a read-only install is left as it is.
    """
    package = os.path.dirname(os.path.abspath(ivralo_kernel.__file__))
    try:
        return bool(compileall.compile_dir(package, quiet=2))
    except OSError:
        return False


def _write(spec: dict[str, Any], name: str, *, user: bool, prefix: str | None) -> str:
    compile_bytecode()
    with tempfile.TemporaryDirectory() as staging:
        Path(staging, "kernel.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
        Path(staging, "logo-svg.svg").write_text(LOGO_SVG, encoding="utf-8")
        try:
            return str(KernelSpecManager().install_kernel_spec(staging, kernel_name=name, user=user, prefix=prefix))
        except PermissionError as exc:
            raise KernelSpecError(
                f"cannot write the kernelspec to {exc.filename}: permission denied. "
                "Install for yourself with --user, or into this environment with --sys-prefix."
            ) from None
