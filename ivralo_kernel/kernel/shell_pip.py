"""[kernel] ``!pip install``, ``!python -m pip install`` and ``!uv pip install`` aimed outside the
workspace: refused before they run, with ``%pip``'s sentence, instead of pip's own ``OSError: [Errno 30]
Read-only file system`` (the write floor would refuse them anyway).

Where each would write, as the tool itself decides it: ``--target``/``--prefix``/``--root``, ``--user``,
else the environment of the pip (its script's interpreter) or of the python run with ``-m pip``; for uv,
``--python``, ``--system``, ``VIRTUAL_ENV``, ``CONDA_PREFIX``, else a ``.venv`` in the working folder or
above it. When that cannot be known (a version request such as ``--python 3.12``, no pip on PATH), the
command runs and the tool says what it says.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
from collections.abc import Callable

from IPython.core.error import UsageError

from ivralo_kernel.kernel.pip_magic import CHANGES_THE_ENVIRONMENT, _inside, _option, outside_workspace

_PIP = re.compile(r"pip(\d+(\.\d+)?)?")
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_PREFIXES = frozenset({"env", "sudo", "exec", "command", "nohup", "time"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
# pip's general options that take a value (before the subcommand).
_PIP_VALUED = frozenset(
    {"--python", "--log", "--cache-dir", "--proxy", "--timeout", "--retries", "--exists-action", "--cert"}
    | {"--client-cert", "--trusted-host", "--keyring-provider", "--use-feature", "--use-deprecated", "--src"}
)
_SEPARATORS = frozenset({";", "&", "&&", "|", "||", "(", ")", ";;", "|&"})


def simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``;``, ``&&``, ``|``, ...), each without its leading
    variable assignments and ``env``/``sudo``-like prefixes; [] when the line does not parse."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS:
                commands.append([])
            else:
                commands[-1].append(token)
    except ValueError:
        return []
    out = []
    for words in commands:
        while words and (_ASSIGNMENT.fullmatch(words[0]) or words[0] in _PREFIXES):
            words = words[1:]
        if words:
            out.append(words)
    return out


def _environment(python_or_env: str) -> str:
    """The environment of an interpreter (``ENV/bin/python``), or the folder itself when given one."""
    path = os.path.abspath(os.path.expanduser(python_or_env))
    return path if os.path.isdir(path) else os.path.dirname(os.path.dirname(path))


def _program_environment(program: str) -> str | None:
    """The environment a program on PATH belongs to: its script's interpreter's (pip's own scripts
    name it on their ``#!`` line), else the folder above its ``bin``; None when it is not found."""
    found = shutil.which(program)
    if found is None:
        return None
    try:
        with open(found, "rb") as f:
            first = f.readline(512)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        interpreter = os.fsdecode(first[2:]).strip().split(" ")[0]
        if _PYTHON.fullmatch(os.path.basename(interpreter)) and os.path.isabs(interpreter):
            return _environment(interpreter)
    return _environment(found)


def _pip_command(args: list[str]) -> tuple[str | None, list[str], str | None]:
    """(pip's subcommand, its arguments, ``--python``'s value) from the words after ``pip``."""
    python, i = None, 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i].split("=", 1)[0]
        if flag in _PIP_VALUED and "=" not in args[i]:
            if flag == "--python" and i + 1 < len(args):
                python = args[i + 1]
            i += 2
            continue
        if flag == "--python":
            python = args[i].split("=", 1)[1]
        i += 1
    if i >= len(args):
        return None, [], python
    return args[i], args[i + 1 :], python


def _explicit_target(args: list[str]) -> str | None:
    target = _option(args, "--target", "-t") or _option(args, "--prefix", "--root")
    if target:
        return os.path.abspath(target)
    if "--user" in args:
        return site.getusersitepackages()
    return None


def _uv_environment(args: list[str]) -> str | None:
    """Where ``uv pip install ARGS`` installs, as uv chooses it; None when that is not known here."""
    python = _option(args, "--python", "-p")
    if python:
        return _environment(python) if os.sep in python or os.path.exists(python) else None
    if "--system" in args:
        return _program_environment("python3")
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if os.environ.get(variable):
            return os.path.abspath(os.environ[variable])
    folder = os.getcwd()
    while True:
        if os.path.isfile(os.path.join(folder, ".venv", "pyvenv.cfg")):
            return os.path.join(folder, ".venv")
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def install_target(words: list[str]) -> tuple[str, str] | None:
    """(what the command is, where it would write) for a pip or uv install or uninstall; None for
    anything else, or when where it writes cannot be known."""
    program, rest = os.path.basename(words[0]), words[1:]
    if _PIP.fullmatch(program):
        shown, (what, args, python) = "pip", _pip_command(rest)
    elif _PYTHON.fullmatch(program) and rest[:2] == ["-m", "pip"]:
        shown, (what, args, python) = f"{program} -m pip", _pip_command(rest[2:])
    elif program == "uv" and rest[:1] == ["pip"]:
        shown, what, args, python = "uv pip", rest[1] if len(rest) > 1 else None, rest[2:], None
    else:
        return None
    if what not in CHANGES_THE_ENVIRONMENT:
        return None
    target = _explicit_target(args)
    if target is None:
        if shown == "uv pip":
            target = _uv_environment(args)
        elif python:
            target = _environment(python)
        elif shown == "pip":
            target = _program_environment(words[0])
        else:
            interpreter = shutil.which(words[0])
            target = _environment(interpreter) if interpreter else None
    return (f"!{shown} {what}", target) if target else None


def shell_pip_check(workspace: str) -> Callable[[str], None]:
    """A check for each ``!`` command (``compat.check_shell_commands``): an install or uninstall that
    would write outside ``workspace`` is a ``UsageError`` with ``%pip``'s sentence."""

    def check(line: str) -> None:
        for words in simple_commands(line):
            found = install_target(words)
            if found is not None and not _inside(found[1], workspace):
                raise UsageError(outside_workspace(found[0], found[1], workspace, shlex.join(words)))

    return check
