"""The rooms of DESIGN.md §4: a forbidden import edge fails this test.

``ivralo_kernel/compat.py`` (every use of an ipykernel, IPython or jupyter_client internal) is shared
by the kernel and the host. It imports no room but protocol, and no third-party package at its top; an entry that
needs a library imports it in its body, and a room may use only the entries whose imports it may make.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

PACKAGE = Path(__file__).resolve().parents[1] / "ivralo_kernel"
ROOMS = ("protocol", "guards", "supervisor", "kernel", "host", "cli")
COMPAT = PACKAGE / "compat.py"
COMPAT_USERS = {"kernel", "host"}  # the rooms that run ipykernel's or jupyter_client's code
THIRD_PARTY_LIMITED = {"ipykernel", "jupyter_client", "traitlets", "psutil", "zmq", "IPython", "dotenv", "nbclient"}

# room -> what it may import: other rooms, and third-party top-level packages
ALLOWED: dict[str, tuple[set[str], set[str]]] = {
    "protocol": (set(), set()),
    "guards": ({"protocol"}, set()),
    "supervisor": ({"protocol"}, set()),
    # pyarrow and numpy: the namespace API's data plane, imported where a table or an array is on the way.
    "kernel": ({"guards", "protocol"}, {"ipykernel", "traitlets", "IPython", "dotenv", "zmq", "pyarrow", "numpy"}),
    "host": (
        {"protocol"},
        {"jupyter_client", "jupyter_core", "traitlets", "psutil", "zmq", "dotenv", "sqlalchemy", "httpx"}
        | {"pyarrow", "numpy"}
        | {"tornado"}  # the websocket to a Kernel Gateway (host/gateway.py)
        | {"jupyter_server"},  # a server's kernel websocket class (host/prompt_websocket.py), in that server
    ),
    "cli": ({"host", "protocol"}, {"jupyter_client", "nbclient", "nbformat", "jupyter_core"}),
}


def imported_modules(path: Path | ast.AST) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8")) if isinstance(path, Path) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
            if node.module == "ivralo_kernel":  # `from ivralo_kernel import compat` is an edge too
                found += [f"ivralo_kernel.{alias.name}" for alias in node.names if alias.name == "compat"]
    return found


def compat_entries() -> dict[str, set[str]]:
    """compat's top-level names -> the third-party packages their bodies import."""
    entries: dict[str, set[str]] = {}
    for node in ast.parse(COMPAT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            entries[node.name] = {m.split(".")[0] for m in imported_modules(node)} - {"ivralo_kernel"}
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
        elif isinstance(node, ast.ImportFrom) and node.module == "ivralo_kernel.compat":
            used.update(alias.name for alias in node.names)
    return used


def violations(room: str, path: Path) -> list[str]:
    rooms_ok, third_ok = ALLOWED[room]
    bad = []
    for module in imported_modules(path):
        parts = module.split(".")
        if parts[0] == "ivralo_kernel":
            if len(parts) == 1:
                continue  # the root holds only __version__
            target = parts[1]
            if target != room and target in ROOMS and target not in rooms_ok:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {module} ({room} -> {target})")
            elif target == "compat" and room not in COMPAT_USERS:
                bad.append(f"{path.relative_to(PACKAGE.parent)} imports {module} ({room} -> compat)")
        elif parts[0] in THIRD_PARTY_LIMITED | {"nbformat", "jupyter_core"} and parts[0] not in third_ok:
            bad.append(f"{path.relative_to(PACKAGE.parent)} imports {module} ({room} may not use {parts[0]})")
    if room in COMPAT_USERS:
        entries = compat_entries()
        for name in sorted(compat_names_used(path)):
            if name not in entries:
                bad.append(f"{path.relative_to(PACKAGE.parent)} uses compat.{name}, which compat does not define")
            for package in sorted(entries.get(name, set()) - third_ok):
                bad.append(f"{path.relative_to(PACKAGE.parent)} uses compat.{name}, which imports {package}")
    return bad


@pytest.mark.parametrize("room", ROOMS)
def test_room_imports_only_what_it_may(room: str) -> None:
    files = sorted((PACKAGE / room).rglob("*.py"))
    assert files, f"room {room} is missing"
    problems = [v for f in files for v in violations(room, f)]
    assert not problems, "\n".join(problems)


def test_root_init_holds_only_the_version() -> None:
    assert imported_modules(PACKAGE / "__init__.py") == []


def test_compat_imports_no_room_and_nothing_third_party_at_its_top() -> None:
    tree = ast.parse(COMPAT.read_text(encoding="utf-8"))
    top = [m for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom) for m in imported_modules(node)]
    third_party = [m for m in top if m.split(".")[0] in THIRD_PARTY_LIMITED | {"nbformat", "jupyter_core"}]
    assert not third_party, f"compat.py imports {third_party} at its top: import inside the entry that needs it"
    rooms = [m for m in imported_modules(COMPAT) if m.startswith("ivralo_kernel.") and m.split(".")[1] != "protocol"]
    assert not rooms, (
        f"compat.py imports {rooms}: it is shared by the kernel and the host, and uses no room but protocol"
    )
    # Its bodies import only what the kernel or the host may.
    allowed = ALLOWED["kernel"][1] | ALLOWED["host"][1]
    for name, packages in compat_entries().items():
        assert packages <= allowed, f"compat.{name} imports {packages - allowed}"


def test_checker_catches_a_forbidden_edge(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from ivralo_kernel.host import Session\nimport ipykernel\nfrom ivralo_kernel import compat\n")
    problems = violations("guards", bad.rename(PACKAGE / "guards" / "_probe_bad.py"))
    (PACKAGE / "guards" / "_probe_bad.py").unlink()
    assert len(problems) == 3, problems


def test_checker_catches_a_compat_entry_of_the_other_room(tmp_path: Path) -> None:
    # popen_kwargs imports jupyter_client: the host's, never the kernel's.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from ivralo_kernel import compat\nfrom ivralo_kernel.compat import no_such_entry\n"
        "compat.popen_kwargs({})\ncompat.shell_parent_ident(None)\n"
    )
    problems = violations("kernel", bad.rename(PACKAGE / "kernel" / "_probe_bad.py"))
    (PACKAGE / "kernel" / "_probe_bad.py").unlink()
    assert len(problems) == 2, problems
    assert "compat.no_such_entry" in problems[0] and "compat.popen_kwargs, which imports jupyter_client" in problems[1]
