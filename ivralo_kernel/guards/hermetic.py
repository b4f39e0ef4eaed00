"""[guards] The hermetic surface's import hook: user code imports the standard library and ivralo's
helpers only. It changes interpreter state (``builtins.__import__``, ``sys.meta_path``).

Whose import is it? The kernel imports third-party modules all its life (ipykernel, IPython, zmq,
traitlets, tornado at start; debugpy when a debugger attaches; jedi for a completion), and none of
that may break. Rules considered:

* a snapshot of ``sys.modules`` at start, refusing any later third-party import: breaks the kernel's
  own lazy imports (debugpy), and lets a cell import every module the kernel happened to load;
* the file name of the importing frame (a cell's ``/tmp/ipykernel_<pid>/<hash>.py``): depends on
  ipykernel's compiler, and misses code defined in a cell and called later by a library;
* **the importer's globals are the user namespace** (chosen): a cell's code, and every function or
  class defined in one, runs with the shell's ``user_global_ns`` as its globals, whatever file name
  it was compiled under; the kernel's own code never does.

Python imports in two ways, so there are two hooks:

1. ``builtins.__import__``, which every ``import`` statement calls with its module's globals: for a
   statement of user code the top-level module must be on the surface, whether it is loaded already
   (``import zmq`` finds the kernel's own copy in ``sys.modules``) or not;
2. a finder first on ``sys.meta_path``, asked for every module not loaded yet however it is asked
   for (``importlib.import_module``, a library's lazy import): a new top-level module off the surface
   is refused while user code is on the stack. The kernel's own lazy imports (debugpy, jedi) have no
   user frame on their stack and pass; a helper's (``ivralo.sql(..., dataframe=True)`` needs pandas)
   has one and is refused, as the surface says.

Submodules of a loaded package are not judged (their package was judged when it was imported).
This is the surface's shape, not a boundary: a module the kernel loaded stays reachable through
another one's attributes. The write guard, the sandbox and Landlock are the boundary.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from ivralo_kernel.protocol.errors import HermeticImportError

# The advertised helpers: the broker's API, also in every cell's namespace as ``ivralo``.
HELPER_MODULES = ("ivralo",)
OWN_PACKAGE = __name__.split(".")[0]


def on_surface(module: str) -> bool:
    """A top-level module user code may import on the hermetic surface."""
    return module in sys.stdlib_module_names or module in HELPER_MODULES


class HermeticImports:
    def __init__(self, is_user_globals: Callable[[Mapping[str, Any]], bool]) -> None:
        self.is_user_globals = is_user_globals
        self.refusals = 0
        self._import = builtins.__import__

    def refuse(self, module: str) -> HermeticImportError:
        self.refusals += 1
        return HermeticImportError(module)

    def __call__(
        self,
        name: str,
        globals: Mapping[str, Any] | None = None,  # __import__'s own parameter names
        locals: Mapping[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> ModuleType:
        if level == 0 and globals is not None and self.is_user_globals(globals):
            top = name.partition(".")[0]
            if not on_surface(top):
                raise self.refuse(top)
        return self._import(name, globals, locals, fromlist, level)

    def user_code_on_stack(self) -> bool:
        frame = sys._getframe(1)
        while frame is not None:
            if self.is_user_globals(frame.f_globals):
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False


class _HermeticFinder(importlib.abc.MetaPathFinder):
    def __init__(self, imports: HermeticImports) -> None:
        self.imports = imports

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or on_surface(fullname) or fullname == OWN_PACKAGE:
            return None  # a submodule, or a module of the surface: the other finders go on
        if self.imports.user_code_on_stack():
            raise self.imports.refuse(fullname)
        return None


def install_hermetic_imports(is_user_globals: Callable[[Mapping[str, Any]], bool]) -> HermeticImports:
    """Installed once the kernel is built (the user namespace exists then, and no user code ran before)."""
    imports = HermeticImports(is_user_globals)
    builtins.__import__ = imports
    sys.meta_path.insert(0, _HermeticFinder(imports))
    return imports
