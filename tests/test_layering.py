"""The rooms of DESIGN.md §4: a forbidden import edge fails this test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

PACKAGE = Path(__file__).resolve().parents[1] / "ivralo_kernel"
ROOMS = ("protocol", "guards", "supervisor", "kernel", "host", "cli")
THIRD_PARTY_LIMITED = {"ipykernel", "jupyter_client", "traitlets", "psutil", "zmq", "IPython", "dotenv", "nbclient"}

# room -> what it may import: other rooms, and third-party top-level packages
ALLOWED: dict[str, tuple[set[str], set[str]]] = {
    "protocol": (set(), set()),
    "guards": ({"protocol"}, set()),
    "supervisor": ({"protocol"}, set()),
    "kernel": ({"guards", "protocol"}, {"ipykernel", "traitlets", "IPython", "dotenv", "zmq"}),
    "host": (
        {"protocol"},
        {"jupyter_client", "jupyter_core", "traitlets", "psutil", "zmq", "dotenv", "sqlalchemy", "httpx"},
    ),
    "cli": ({"host", "protocol"}, {"jupyter_client", "nbclient", "nbformat", "jupyter_core"}),
}


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


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
        elif parts[0] in THIRD_PARTY_LIMITED | {"nbformat", "jupyter_core"} and parts[0] not in third_ok:
            bad.append(f"{path.relative_to(PACKAGE.parent)} imports {module} ({room} may not use {parts[0]})")
    return bad


@pytest.mark.parametrize("room", ROOMS)
def test_room_imports_only_what_it_may(room: str) -> None:
    files = sorted((PACKAGE / room).rglob("*.py"))
    assert files, f"room {room} is missing"
    problems = [v for f in files for v in violations(room, f)]
    assert not problems, "\n".join(problems)


def test_root_init_holds_only_the_version() -> None:
    assert imported_modules(PACKAGE / "__init__.py") == []


def test_checker_catches_a_forbidden_edge(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from ivralo_kernel.host import Session\nimport ipykernel\n")
    problems = violations("guards", bad.rename(PACKAGE / "guards" / "_probe_bad.py"))
    (PACKAGE / "guards" / "_probe_bad.py").unlink()
    assert len(problems) == 2
