"""[host] What a project's kernel takes from ivralo's environment: ivralo_kernel, ipykernel and the
distributions ipykernel needs (its requirements, followed to the end, markers evaluated here), and
nothing else of it.

A project's interpreter without ivralo gets these through ``protocol.private_code``: the kernel serves
only their top-level modules (and their metadata) from ivralo's private path, after the project's own
packages, so ``import requests`` works in the notebook exactly when it works under ``uv run``.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ivralo_kernel.protocol.private_code import OWN_DISTRIBUTION, OWN_MODULE

ROOTS = ("ipykernel",)  # the kernel side's third-party needs (guards, supervisor: the standard library)


@dataclass(frozen=True)
class KernelClosure:
    """The distributions (canonical names) and the top-level modules they provide."""

    distributions: tuple[str, ...]
    modules: tuple[str, ...]


@functools.cache
def kernel_closure(roots: tuple[str, ...] = ROOTS) -> KernelClosure:
    """ivralo_kernel and ``roots`` with everything they require in this environment (a requirement
    whose marker is false here, or that is not installed, is left out)."""
    seen: dict[str, metadata.Distribution] = {}
    queue: deque[tuple[str, frozenset[str]]] = deque((root, frozenset()) for root in roots)
    extras_done: dict[str, set[str]] = {}
    while queue:
        name, extras = queue.popleft()
        key = canonicalize_name(name)
        done = extras_done.setdefault(key, set())
        if key in seen and extras <= done:
            continue
        try:
            dist = seen.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[key] = dist
        done |= extras
        for line in dist.requires or ():
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            wanted = ("", *sorted(extras))
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted):
                queue.append((req.name, frozenset(req.extras)))
    modules = {OWN_MODULE}
    for dist in seen.values():
        modules |= top_level_modules(dist)
    return KernelClosure(tuple(sorted({*seen, OWN_DISTRIBUTION})), tuple(sorted(modules)))


def top_level_modules(dist: metadata.Distribution) -> set[str]:
    """The importable top-level names a distribution installs: its ``top_level.txt`` when it has one,
    and the first part of each file it recorded (a package folder, a ``.py`` file, an extension)."""
    names = {line.strip() for line in (dist.read_text("top_level.txt") or "").splitlines()}
    for file in dist.files or ():
        parts = file.parts
        if not parts or parts[0] in ("..", "__pycache__") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        first = parts[0]
        if len(parts) > 1:
            names.add(first)
        elif first.endswith(".py"):
            names.add(first[:-3])
        elif first.endswith((".so", ".pyd")):
            names.add(first.split(".")[0])
    return {n for n in names if n.isidentifier() and not n.startswith("__editable__")}
