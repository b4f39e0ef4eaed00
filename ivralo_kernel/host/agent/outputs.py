"""[host] What a cell showed, as plain text: the one output collector of ``Session`` (IOPub
messages, for the agent contract: a ``str``, or an error dict), ``ivralo-kernel run`` (a notebook's
saved outputs) and the tests."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any, cast

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import Effects

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass
class CellOutput:
    """Accumulates what a person would have seen under the cell, as plain text."""

    parts: list[str] = field(default_factory=list)
    error: str | None = None
    streams: dict[str, str] = field(default_factory=dict)  # "stdout"/"stderr" -> its text alone
    images: list[str] = field(default_factory=list)  # PNG display data, base64 as Jupyter sends it (MCP's images)

    @classmethod
    def from_notebook(cls, outputs: list[dict[str, Any]]) -> CellOutput:
        """A saved cell's outputs (nbformat's: the same fields as IOPub's contents)."""
        collected = cls()
        for output in outputs:
            collected.add_content(str(output.get("output_type")), output)
        return collected

    def add(self, msg: dict[str, Any]) -> None:
        """One IOPub message of the cell."""
        self.add_content(msg["header"]["msg_type"], msg["content"])

    def take(self, msg: dict[str, Any]) -> bool:
        """One IOPub message of the cell: its output is kept; True once the kernel says it is idle."""
        if msg["header"]["msg_type"] == "status":
            return bool(msg["content"].get("execution_state") == "idle")
        self.add(msg)
        return False

    def add_content(self, kind: str, content: dict[str, Any]) -> None:
        if kind == "stream":
            text = content.get("text", "")
            self.parts.append(text)
            name = str(content.get("name", "stdout"))
            self.streams[name] = self.streams.get(name, "") + text
        elif kind in ("execute_result", "display_data"):
            png = content.get("data", {}).get("image/png")
            if isinstance(png, str):
                self.images.append(png)
            text = content.get("data", {}).get("text/plain")
            if text is not None:
                self.parts.append(text if text.endswith("\n") else text + "\n")
        elif kind == "error":
            lines = content.get("traceback") or [f"{content.get('ename')}: {content.get('evalue')}"]
            self.error = strip_ansi("\n".join(lines))
        elif kind == "clear_output":
            self.parts.clear()
            self.images.clear()

    @property
    def text(self) -> str:
        return strip_ansi("".join(self.parts))

    @property
    def shown(self) -> str:
        """What a person reading the notebook sees under the cell: the output, then the traceback."""
        return self.text + (self.error + "\n" if self.error is not None else "")


class RunText(str):
    """A run's output: a ``str``, as the contract has it, that also says what the execution did
    (``effects``: the kernel's ``ivralo.effects``, or None when the kernel could not say)."""

    effects: Effects | None = None
    images: tuple[str, ...] = ()  # the cell's PNG display data (base64), for hosts that show images


class RunError(dict[str, str]):
    """A run's error dict (``status``, ``result``, ``error``), with ``effects`` and ``images`` as
    ``RunText`` has them."""

    effects: Effects | None = None
    images: tuple[str, ...] = ()


def effects_in(metadata: dict[str, Any] | None) -> Effects | None:
    """The kernel's ``ivralo.effects`` in a reply's (or a saved cell's) metadata, if it reported them."""
    effects = (metadata or {}).get(names.KERNEL_INFO_SECTION, {}).get("effects")
    return cast(Effects, effects) if isinstance(effects, dict) else None


def with_effects(
    result: str | dict[str, str], effects: Effects | None, images: tuple[str, ...] = ()
) -> RunText | RunError:
    shown: RunText | RunError = RunText(result) if isinstance(result, str) else RunError(result)
    shown.effects = effects
    shown.images = images
    return shown


def effects_line(effects: Effects) -> str:
    """One line for a person: "2 files changed (a.csv, b.csv); hosts: pypi.org allowed; ran sh; ..."."""

    def listed(paths: list[str]) -> str:
        shown = ", ".join(paths[:3]) + (f", and {len(paths) - 3} more" if len(paths) > 3 else "")
        return f"{len(paths)} {'file' if len(paths) == 1 else 'files'} {{}} ({shown})"

    files = effects.get("files") or {}
    parts = [listed(files[kind]).format(kind) for kind in ("created", "changed", "deleted") if files.get(kind)]
    if effects.get("files_note"):
        parts.append(f"files: {effects['files_note']}")
    hosts = effects.get("hosts") or {}
    if hosts:
        parts.append("hosts: " + ", ".join(f"{host} {outcome}" for host, outcome in hosts.items()))
    calls = effects.get("calls") or []
    if calls:
        parts.append(f"{len(calls)} brokered {'call' if len(calls) == 1 else 'calls'}")
    processes = effects.get("processes") or []
    if processes:
        parts.append("ran " + ", ".join(dict.fromkeys(processes)))
    parts.append(
        f"peak {effects.get('peak_rss_bytes', 0) / (1 << 20):.0f} MiB, {effects.get('cpu_s', 0):.2f} s CPU, "
        f"{effects.get('wall_s', 0):.2f} s"
    )
    return "; ".join(parts)


def error_result(result: str, error: str, status: str = "error") -> dict[str, str]:
    return {"status": status, "result": result, "error": error}


def lost_names_message(cause: str, lost: list[str], also: list[str] | tuple[str, ...] = ()) -> str:
    """The loss, said once (``Session``'s ``error``): why, the names the session had, and ``also``:
    the names the killed call itself assigns (from its code), which it may have set before the end."""
    names = ", ".join(lost) if lost else "(none were defined)"
    assigned = [name for name in also if name not in lost]
    may_also = f"The names the stopped call assigns may also be lost: {', '.join(assigned)}. " if assigned else ""
    return (
        f"REPL worker terminated ({cause}). ALL variables in this session were lost: {names}. {may_also}"
        "You must recreate any state you need before retrying."
    )


def assigned_names(code: str) -> list[str]:
    """The names ``code`` binds in the session's namespace (assignments, imports, ``def``/``class``,
    ``for``/``with``/``except``/``match`` targets, a walrus; not the locals of a function, class or
    comprehension), sorted; names starting with ``_`` left out, as the session's own list leaves them
    out. Code that is not Python (a magic) has none."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    binder = _TopLevelNames()
    binder.visit(tree)
    return sorted(name for name in binder.found if not name.startswith("_"))


class _TopLevelNames(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store):
            self.found.add(node.id)

    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.found.add(node.name)  # its body's names are its own; what runs at top level is visited
        outer: list[ast.AST] = [*node.decorator_list]
        if isinstance(node, ast.ClassDef):
            outer += [*node.bases, *(keyword.value for keyword in node.keywords)]
        else:
            outer += [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
        for part in outer:
            self.visit(part)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _definition

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for part in (*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)):
            self.visit(part)

    def _comprehension(self, node: ast.AST) -> None:
        # Its loop variables are its own; a walrus inside binds in the namespace.
        walrus = [sub.target for sub in ast.walk(node) if isinstance(sub, ast.NamedExpr)]
        self.found.update(target.id for target in walrus if isinstance(target, ast.Name))

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.update((alias.asname or alias.name).split(".")[0] for alias in node.names if alias.name != "*")

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.found.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.found.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.found.add(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.found.add(node.rest)
        self.generic_visit(node)
