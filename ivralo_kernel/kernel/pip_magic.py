"""[kernel] ``%pip``: IPython's magic, except that an install the write floor would refuse is refused
first, in one sentence, instead of a page of pip's permission traceback.

Code in the kernel may write only inside its workspace. A project's own environment (``.venv`` in the
workspace) is inside it, and ``%pip install`` works there as usual; the environment ivralo runs in
usually is not.
"""

from __future__ import annotations

import os
import shlex
import site
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

CHANGES_THE_ENVIRONMENT = ("install", "uninstall")


def _option(args: list[str], *flags: str) -> str | None:
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def pip_target(args: list[str]) -> str:
    """Where ``pip install`` with these arguments writes its packages."""
    target = _option(args, "--target", "-t")
    if target:
        return os.path.abspath(target)
    prefix = _option(args, "--prefix", "--root")
    if prefix:
        return os.path.abspath(prefix)
    if "--user" in args:
        return site.getusersitepackages()
    return sysconfig.get_paths()["purelib"]


def _inside(path: str, root: str) -> bool:
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def outside_workspace(what: str, target: str, workspace: str, instead: str) -> str:
    """The sentence for an install (``%pip install``, ``!pip install``, ...) that would write outside the
    workspace; ``instead``: the command to run from a terminal."""
    return (
        f"{what} would write to {target}, outside the workspace {workspace} where code in this kernel may "
        f"write, so run it from a terminal instead ({instead}), or make the project's own .venv inside the "
        f"workspace and run the kernel from it."
    )


def guarded_pip(
    original: Callable[[str], Any], workspace: str, name: str = "%pip", instead: Callable[[str], str] | None = None
) -> Callable[[str], Any]:
    """``original`` (``name``: ``%pip``, ``%uv pip``), after the workspace's check; ``instead``: the
    command the sentence says to run from a terminal (``python -m pip ...``)."""

    def pip(line: str) -> Any:
        try:
            args = shlex.split(line)
        except ValueError:
            return original(line)  # pip says what is wrong with the line
        command = next((a for a in args if not a.startswith("-")), None)
        if command in CHANGES_THE_ENVIRONMENT:
            target = pip_target(args)
            if not _inside(target, workspace):
                terminal = instead(line) if instead is not None else f"{sys.executable} -m pip {line}"
                raise UsageError(outside_workspace(f"{name} {command}", target, workspace, terminal))
        return original(line)

    pip.__doc__ = getattr(original, "__doc__", None)
    return pip
