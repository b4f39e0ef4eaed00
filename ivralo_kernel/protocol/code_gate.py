"""[protocol] The static code gate's rule engine: (code, rules) -> the first denial, or None.

Stdlib ``ast`` only, so the host (``host/agent/code_gate.py``, before a worker is contacted) and the kernel
(an AST transformer, before a cell runs) judge code by the same rules.

What it looks at:

* imports (``import x``, ``from x import y``): the top-level module must be on the allow-list;
* names (``eval``, ``get_ipython``), read, bound or deleted anywhere in the code;
* attributes (``obj.__globals__``), and the same names given as a constant string to
  ``getattr``/``setattr``/``delattr``/``hasattr``;
* calls by dotted name (``os.system(...)``), through the code's own import aliases
  (``import os as o; o.system`` and ``from os import system; system`` are ``os.system``).

It is a convenience, not a boundary: a name built at run time (``getattr(x, "__glo" + "bals__")``),
a module reached through another module's attribute (``json.codecs.sys``), or an import by string
through an allowed module are invisible to it. The runtime guards (write and read guards, the
sandbox, Landlock, the egress policy) are what holds.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from typing import Final

# The allow-list's entry for the standard library, less REACHES_OUTSIDE.
STDLIB: Final = "stdlib"
# Standard modules that reach outside Python's own objects: foreign calls, processes, raw sockets,
# the import machinery, other frames. Not in "stdlib"; name one in the allow-list to allow it.
REACHES_OUTSIDE: Final = (
    "_ctypes",
    "_posixsubprocess",
    "_socket",
    "builtins",
    "code",
    "codeop",
    "ctypes",
    "gc",
    "importlib",
    "marshal",
    "multiprocessing",
    "pty",
    "runpy",
    "socket",
    "subprocess",
)
DEFAULT_MODULES: Final = (STDLIB,)
# The builtins that run text as code or import by string, and those that reach the namespaces.
DEFAULT_DENIED_NAMES: Final = (
    "__builtins__",
    "__import__",
    "__loader__",
    "__spec__",
    "breakpoint",
    "compile",
    "eval",
    "exec",
    "get_ipython",
    "globals",
    "locals",
    "vars",
)
# Attributes that lead from any object to code, frames, globals or every class.
DEFAULT_DENIED_ATTRIBUTES: Final = (
    "__base__",
    "__bases__",
    "__builtins__",
    "__closure__",
    "__code__",
    "__globals__",
    "__mro__",
    "__subclasses__",
    "ag_frame",
    "cr_frame",
    "f_back",
    "f_builtins",
    "f_globals",
    "f_locals",
    "gi_frame",
    "tb_frame",
)
DEFAULT_DENIED_CALLS: Final = (
    "builtins.__import__",
    "builtins.compile",
    "builtins.eval",
    "builtins.exec",
    "importlib.import_module",
    "os.execl",
    "os.execle",
    "os.execlp",
    "os.execlpe",
    "os.execv",
    "os.execve",
    "os.execvp",
    "os.execvpe",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.popen",
    "os.posix_spawn",
    "os.posix_spawnp",
    "os.spawnl",
    "os.spawnle",
    "os.spawnlp",
    "os.spawnlpe",
    "os.spawnv",
    "os.spawnve",
    "os.spawnvp",
    "os.spawnvpe",
    "os.system",
    "sys._getframe",
)
_ATTRIBUTE_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})

# The rules' names in a denial are the settings that hold them (host/settings/resolve.py).
RULE_MODULES: Final = "code_gate_modules"
RULE_NAMES: Final = "code_gate_denied_names"
RULE_ATTRIBUTES: Final = "code_gate_denied_attributes"
RULE_CALLS: Final = "code_gate_denied_calls"
RULE_SYNTAX: Final = "code_gate_python_only"
# The hermetic surface's own rule (in the kernel, on every cell, gate or not).
RULE_HERMETIC: Final = "hermetic_builtins"
HERMETIC_BUILTINS: Final = ("exec", "eval", "compile", "__import__")


@dataclass(frozen=True)
class GateRules:
    """What the gate allows. ``modules`` None: any import; the others: empty denies nothing."""

    modules: tuple[str, ...] | None = DEFAULT_MODULES
    denied_names: tuple[str, ...] = DEFAULT_DENIED_NAMES
    denied_attributes: tuple[str, ...] = DEFAULT_DENIED_ATTRIBUTES
    denied_calls: tuple[str, ...] = DEFAULT_DENIED_CALLS

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> GateRules:
        """From the policy file's JSON (lists), ignoring keys this version does not know."""
        fields: dict[str, tuple[str, ...] | None] = {}
        for name in cls.__dataclass_fields__:
            value = data.get(name, getattr(cls, name))
            fields[name] = None if value is None else tuple(str(v) for v in value)  # type: ignore[attr-defined]
        return cls(**fields)  # type: ignore[arg-type]

    def allowed_modules(self) -> frozenset[str] | None:
        if self.modules is None:
            return None
        allowed = set(self.modules)
        if STDLIB in allowed:
            allowed |= set(sys.stdlib_module_names) - set(REACHES_OUTSIDE)
        return frozenset(allowed)


HERMETIC_RULES: Final = GateRules(modules=None, denied_names=HERMETIC_BUILTINS, denied_attributes=(), denied_calls=())


@dataclass(frozen=True)
class Denial:
    rule: str  # the setting that holds the rule (RULE_*)
    target: str  # what it names: a module, a builtin, an attribute, a dotted call
    line: int
    what: str  # "import of 'ctypes'", "the name 'eval'", ...

    def message(self) -> str:
        """The sentence after ``SecurityError:``."""
        if self.rule == RULE_HERMETIC:
            return (
                f"hermetic surface: {self.what} at line {self.line} refused before the code ran (rule {self.rule}: "
                f"{self.target}; exec, eval, compile and __import__ are not available on this surface). Write the "
                f"code out directly, or run it on the project surface (the ivralo kernel, or "
                f'Session(surface="project")).'
            )
        if self.rule == RULE_SYNTAX:
            return (
                f"code gate: {self.what} at line {self.line} refused before the code ran (rule {self.rule}: the gate "
                f"judges Python, and IPython's %magics and !commands run outside its view). Write it as Python."
            )
        return (
            f"code gate: {self.what} at line {self.line} refused before the code ran "
            f"(rule {self.rule}: {self.target}). "
            f"Do it another way, or ask the person to change the gate's {self.rule} setting."
        )


def check_code(code: str, rules: GateRules) -> Denial | None:
    """The first denial in ``code`` (plain Python). Code that does not parse: a line of IPython's
    own syntax is denied (the gate cannot see what a magic or a shell command does); a plain syntax
    error is not the gate's to report (None: the kernel says what is wrong)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return _ipython_syntax(code)
    return check_tree(tree, rules)


def check_hermetic(tree: ast.AST) -> Denial | None:
    """The hermetic surface's rule: ``exec``, ``eval``, ``compile`` and ``__import__`` are not used."""
    denial = check_tree(tree, HERMETIC_RULES)
    if denial is None:
        return None
    return Denial(RULE_HERMETIC, denial.target, denial.line, f"the builtin {denial.target}")


def _ipython_syntax(code: str) -> Denial | None:
    for number, line in enumerate(code.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("%", "!")) or "= !" in line or "=!" in line or "= %" in line:
            return Denial(RULE_SYNTAX, stripped.split(None, 1)[0] if stripped else "", number, "IPython syntax")
    return None


def check_tree(tree: ast.AST, rules: GateRules) -> Denial | None:
    """The first denial in ``tree`` (by line), or None."""
    allowed = rules.allowed_modules()
    names, attributes, calls = set(rules.denied_names), set(rules.denied_attributes), set(rules.denied_calls)
    aliases = _aliases(tree)
    found: list[tuple[int, tuple[int, int], Denial]] = []

    def deny(node: ast.AST, rule: str, target: str, what: str) -> None:
        # Ordered by where each ends: in ``a.__bases__[0].__subclasses__()`` every node starts at ``a``.
        line, end = getattr(node, "lineno", 0), (getattr(node, "end_lineno", 0), getattr(node, "end_col_offset", 0))
        found.append((line, end, Denial(rule, target, line, what)))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and allowed is not None:
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top not in allowed:
                    deny(node, RULE_MODULES, top, f"import of {alias.name!r}")
        elif isinstance(node, ast.ImportFrom) and allowed is not None and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top not in allowed:
                deny(node, RULE_MODULES, top, f"import from {node.module!r}")
        elif isinstance(node, ast.Name) and node.id in names:
            deny(node, RULE_NAMES, node.id, f"the name {node.id!r}")
        elif isinstance(node, ast.Attribute) and node.attr in attributes:
            deny(node, RULE_ATTRIBUTES, node.attr, f"the attribute {node.attr!r}")
        elif isinstance(node, ast.Call):
            dotted = _dotted(node.func, aliases)
            if dotted is not None and dotted in calls:
                deny(node, RULE_CALLS, dotted, f"the call {dotted}()")
            elif dotted in _ATTRIBUTE_FUNCTIONS and len(node.args) >= 2:
                name = node.args[1]
                if isinstance(name, ast.Constant) and name.value in attributes:
                    deny(node, RULE_ATTRIBUTES, str(name.value), f"{dotted}(..., {name.value!r})")
    if not found:
        return None
    return min(found, key=lambda item: (item[0], item[1]))[2]


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> what it was imported as (``o`` -> ``os``, ``system`` -> ``os.system``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _dotted(func: ast.expr, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` for a call's function made of names and attributes, its first name resolved."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(aliases.get(func.id, func.id))
    return ".".join(reversed(parts))
