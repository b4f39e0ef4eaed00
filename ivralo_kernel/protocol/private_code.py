"""[protocol] The private path's finder: a project's interpreter imports ivralo's kernel side from
ivralo's environment, and nothing else of it.

``protocol.bootstrap`` puts the private path (``IVRALO_CODE_PATH``) on ``sys.path`` just long enough
to import this module, whose ``install`` takes it off again and adds a finder at the end of
``sys.meta_path`` (after the path finder, so the project's own copies win) serves the top-level
modules named in ``IVRALO_CODE_MODULES`` (ipykernel and what it needs, ivralo_kernel; the host works
them out, ``host.jupyter.kernel_closure``) from the private path, and ``importlib.metadata`` the
distributions in ``IVRALO_CODE_DISTS``. Any other module of ivralo's environment (requests,
jupyterlab) is the project's or a ``ModuleNotFoundError``, as under ``uv run``. Submodules follow
their package's ``__path__`` and need nothing here.

The standard library only: this runs before anything else of the kernel.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

from ivralo_kernel.protocol import names

OWN_MODULE = "ivralo_kernel"
OWN_DISTRIBUTION = "ivralo-kernel"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it (packaging's canonicalize_name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class PrivateCodeFinder:
    """Serves only ``modules`` (top-level names) and ``distributions`` from ``paths``."""

    def __init__(self, paths: Sequence[str], modules: Iterable[str], distributions: Iterable[str]) -> None:
        self.paths = list(paths)
        self.modules = frozenset(modules) | {OWN_MODULE}
        self.distributions = frozenset(canonical(d) for d in distributions) | {OWN_DISTRIBUTION}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if path is not None or fullname not in self.modules:
            return None
        return PathFinder.find_spec(fullname, self.paths)

    def find_distributions(self, context: Any = None) -> Iterator[Any]:
        """``importlib.metadata``'s question about this interpreter's packages (not a given path's)."""
        from importlib.metadata import DistributionFinder, MetadataPathFinder

        context = context if context is not None else DistributionFinder.Context()
        if "path" in vars(context):  # a search of named folders: the path finder answers it
            return iter(())
        name = getattr(context, "name", None)
        if name is not None and canonical(name) not in self.distributions:
            return iter(())
        found = MetadataPathFinder.find_distributions(DistributionFinder.Context(name=name, path=self.paths))
        return (d for d in found if canonical(d.metadata["Name"] or "") in self.distributions)

    def invalidate_caches(self) -> None:
        pass


def _listed(env_name: str) -> list[str] | None:
    value = os.environ.get(env_name)
    return None if value is None else [v for v in value.split(",") if v]


def install(paths: Sequence[str]) -> None:
    """Take ``paths`` (the bootstrap put them there) off ``sys.path`` and serve the kernel side from
    them. Without ``IVRALO_CODE_MODULES`` (a kernelspec written before it existed) they stay on
    ``sys.path``, as they were then."""
    modules = _listed(names.ENV_CODE_MODULES)
    if modules is None:
        return
    if paths and sys.path[-len(paths) :] == list(paths):
        del sys.path[-len(paths) :]
    sys.meta_path.append(PrivateCodeFinder(paths, modules, _listed(names.ENV_CODE_DISTS) or ()))
