"""[kernel] ``%pip`` in a uv project, and ``%uv``: uv's environments have no pip, so IPython's ``%pip``
(``python -m pip``) says "No module named pip" there, and its ``%uv`` (``python -m uv``) needs uv
installed as a package in the project.

In a uv project's ``.venv`` (its ``pyvenv.cfg`` has the ``uv = <version>`` key uv writes) without a
pip of its own, ``%pip ARGS`` runs ``uv pip ARGS --python <this kernel's python>`` when a uv binary is
found (on PATH, else where uv's installers put it: ``$XDG_BIN_HOME``, ``~/.local/bin``,
``~/.cargo/bin``); with none found it says, in one sentence, to run ``uv add`` in a terminal.
``%uv ARGS`` runs that uv binary (``%uv pip ...`` aimed at this kernel's python, unless the line names
one), and falls back to IPython's ``%uv`` when no binary is found.

The kernel's home is read-only inside the sandbox: when uv's cache folder cannot be written, uv is given
one in the kernel's own temporary folder (``UV_CACHE_DIR``, copies instead of hard links).
"""

from __future__ import annotations

import configparser
import glob
import importlib.util
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

_SELECTS_PYTHON = ("--python", "-p", "--system", "--target", "--prefix")


def uv_venv() -> str | None:
    """This kernel's environment, when uv made it (the ``uv`` key of its ``pyvenv.cfg``)."""
    if sys.prefix == sys.base_prefix:
        return None
    parser = configparser.ConfigParser()
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg"), encoding="utf-8") as f:
            parser.read_string("[venv]\n" + f.read())
    except (OSError, configparser.Error):
        return None
    return sys.prefix if parser["venv"].get("uv") else None


def has_own_pip(prefix: str) -> bool:
    """Whether the environment itself has pip (``python -m pip`` runs without ivralo's private path)."""
    return bool(glob.glob(os.path.join(glob.escape(prefix), "lib*", "python*", "site-packages", "pip", "__init__.py")))


def find_uv() -> str | None:
    """A uv binary: on PATH, else where uv's installers put it."""
    found = shutil.which("uv")
    if found:
        return found
    places = [
        os.environ.get("XDG_BIN_HOME", ""),
        os.path.expanduser("~/.local/bin"),
        os.path.expanduser("~/.cargo/bin"),
    ]
    for place in places:
        candidate = os.path.join(place, "uv") if place else ""
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _cache_writable() -> bool:
    cache = os.environ.get("UV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv"
    )
    path = os.path.abspath(cache)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return os.access(path, os.W_OK)


def uv_argv(uv: str, args: list[str]) -> list[str]:
    """The command ``%uv ARGS`` runs: ``uv pip SUB`` gets ``--python <this python>`` unless the line
    already says where to install; uv's cache moves to the kernel's own temporary folder when the
    usual one cannot be written."""
    argv = [uv, *args]
    if len(args) >= 2 and args[0] == "pip" and not args[1].startswith("-"):
        if not any(a == o or a.startswith(o + "=") for a in args for o in _SELECTS_PYTHON):
            argv = [uv, "pip", args[1], "--python", sys.executable, *args[2:]]
    if not _cache_writable():
        cache = os.path.join(tempfile.gettempdir(), "ivralo-uv-cache")
        link = os.environ.get("UV_LINK_MODE", "copy")
        argv = ["env", f"UV_CACHE_DIR={cache}", f"UV_LINK_MODE={link}", *argv]
    return argv


def terminal_command(line: str) -> str:
    """What ``%pip LINE`` is from a terminal: ``uv pip`` in a uv project's environment without pip."""
    venv = uv_venv()
    if venv is None or has_own_pip(venv):
        return f"{sys.executable} -m pip {line}"
    return uv_pip_command(line)


def uv_pip_command(line: str) -> str:
    args = _split(line)
    return shlex.join(["uv", "pip", *args[:1], "--python", sys.executable, *args[1:]])


def no_uv_sentence(line: str, venv: str) -> str:
    """What to do instead, in one sentence, when this uv project's kernel finds no uv binary."""
    args = _split(line)
    command = next((a for a in args if not a.startswith("-")), "")
    rest = args[args.index(command) + 1 :] if command else []  # uv add takes -r FILE, -U, --find-links too
    if command == "install" and rest:
        instead = f"uv add {shlex.join(rest)}"
    elif command == "uninstall" and rest:
        instead = f"uv remove {shlex.join(a for a in rest if a not in ('-y', '--yes'))}"
    else:
        instead = uv_pip_command(line)
    then = ", then import it here (restart the kernel if an older version was imported)" if command == "install" else ""
    return (
        f"%pip {line}: this kernel runs a uv project's environment ({venv}), which has no pip, and no uv "
        f"binary is on this kernel's PATH (nor in ~/.local/bin or ~/.cargo/bin), so run `{instead}` in a "
        f"terminal in the project{then}."
    )


def through_uv(original: Callable[[str], Any], shell: Any) -> Callable[[str], Any]:
    """``%pip``: IPython's (``original``) unless this is a uv project's environment without pip."""

    def pip(line: str) -> Any:
        venv = uv_venv()
        if venv is None or has_own_pip(venv):
            return original(line)
        uv = find_uv()
        if uv is None:
            raise UsageError(no_uv_sentence(line, venv))
        return shell.system(shlex.join(uv_argv(uv, ["pip", *_split(line)])))

    pip.__doc__ = getattr(original, "__doc__", None)
    return pip


def uv_magic(
    original: Callable[[str], Any] | None, guard: Callable[[Callable[[str], Any]], Callable[[str], Any]], shell: Any
) -> Callable[[str], Any]:
    """``%uv``: the uv binary, ``%uv pip ...`` behind ``guard`` (the workspace's check ``%pip`` has);
    IPython's ``%uv`` (``original``: ``python -m uv``) when there is no binary."""

    def uv(line: str) -> Any:
        binary = find_uv()
        if binary is None:
            if original is not None and importlib.util.find_spec("uv") is not None:
                return original(line)
            raise UsageError(
                "%uv: no uv binary on this kernel's PATH (nor in ~/.local/bin or ~/.cargo/bin), so run uv in a "
                "terminal, or install uv (https://docs.astral.sh/uv/) and restart the kernel."
            )
        args = _split(line)
        if args[:1] == ["pip"]:
            return guard(lambda rest: shell.system(shlex.join(uv_argv(binary, ["pip", *_split(rest)]))))(
                line.split("pip", 1)[1].strip()
            )
        return shell.system(shlex.join(uv_argv(binary, args)))

    uv.__doc__ = __doc__
    return uv


def _split(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()
