"""[kernel] Checks on a cell's code before any of it runs, and the hermetic surface's set-up.

* The hermetic surface's builtins rule (``exec``, ``eval``, ``compile``, ``__import__``) and the static
  code gate (``KernelPolicy.code_gate``; the host checked the same rules before sending the code:
  this is the second check) are one IPython AST transformer. It sees the cell after IPython's own
  syntax is turned into Python (``%magic`` is ``get_ipython().run_line_magic(...)``), and before
  anything runs; raising ``InputRejected`` is the one way a transformer stops a cell (any other
  exception only unregisters it). ``%time``, ``%timeit`` and ``%%capture`` run their code through
  the same transformers, so a magic does not walk around them.
* The hermetic surface also gets its import hook (``guards.hermetic``), installed here because its
  test is "the importer's globals are the user namespace", which exists once the shell does (no user
  code runs before), and a ``%pip`` that says which surface installs packages.
"""

from __future__ import annotations

import ast
from typing import Any

from IPython.core.error import InputRejected, UsageError

from ivralo_kernel.guards.hermetic import HermeticImports, install_hermetic_imports
from ivralo_kernel.protocol import errors
from ivralo_kernel.protocol.code_gate import GateRules, check_hermetic, check_tree

HERMETIC_PIP = (
    "%pip is not available on the hermetic surface, which sees only the standard library and ivralo's "
    'helpers (the ivralo-hermetic kernel, Session(surface="hermetic")). Installed packages are on the project '
    'surface: switch to the ivralo kernel, or use Session(surface="project").'
)


# IPython stops a cell only on its ``InputRejected`` (``transform_ast`` unregisters a transformer that
# raises anything else), and the protocol may not import IPython: so in the kernel the one
# ``SecurityError`` (a PermissionError) is an ``InputRejected`` too. Its reply is an error named
# ``SecurityError``, and ``except SecurityError`` catches it.
if not issubclass(errors.SecurityError, InputRejected):
    errors.SecurityError.__bases__ = (*errors.SecurityError.__bases__, InputRejected)


class CellChecks(ast.NodeTransformer):
    """Refuses a cell by its AST; never changes it."""

    def __init__(self, hermetic: bool, gate: GateRules | None) -> None:
        self.hermetic, self.gate = hermetic, gate
        self.refusals = 0

    def visit(self, node: ast.AST) -> ast.AST:  # the whole cell at once: no walk of ours
        denial = check_hermetic(node) if self.hermetic else None
        if denial is None and self.gate is not None:
            denial = check_tree(node, self.gate)
        if denial is not None:
            self.refusals += 1
            raise errors.SecurityError(denial.message(), rule=denial.rule)
        return node


def install_cell_checks(shell: Any, hermetic: bool, gate: GateRules | None) -> CellChecks | None:
    if not hermetic and gate is None:
        return None
    checks = CellChecks(hermetic, gate)
    shell.ast_transformers.insert(0, checks)  # before any other transformer can change the code
    return checks


def make_hermetic(shell: Any) -> HermeticImports:
    """The hermetic surface's imports and ``%pip``."""

    def is_user_globals(namespace: Any) -> bool:
        return namespace is shell.user_global_ns

    def pip(line: str) -> None:
        raise UsageError(HERMETIC_PIP)

    shell.register_magic_function(pip, "line", "pip")
    shell.register_magic_function(pip, "line", "uv")  # IPython's %uv installs too
    return install_hermetic_imports(is_user_globals)
