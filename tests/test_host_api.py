"""The host's public surface, pinned: ``ivralo_kernel.host.__all__``, the blocking twins in step
with ``Session`` and ``AttachedSession``, keyword-only parameters after ``workspace``, a docstring on
every public name, and the error tree (every error an ``IvraloError``, exported, and drawn in
protocol/errors.py's docstring). Starts no process: everything is read from the classes and the
source."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import ivralo_kernel.host as host
from ivralo_kernel import protocol
from ivralo_kernel.host.agent.attach import AttachedSession, SyncAttachedSession
from ivralo_kernel.host.agent.pool import WorkerPool
from ivralo_kernel.host.agent.session import Session
from ivralo_kernel.host.agent.sync_session import SyncSession
from ivralo_kernel.protocol import errors

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

PACKAGE = Path(host.__file__).resolve().parents[1]

# Adding a name here is a decision about the public API (INTERFACE.md names each); removing one breaks users.
HOST_API = [
    "ArrowMissingError",
    "AttachError",
    "ConfigError",
    "GatewayError",
    "HistoryError",
    "HostMemoryError",
    "InterpreterError",
    "IvraloError",
    "IvraloKernelManager",
    "IvraloProvisioner",
    "NamespaceTimeoutError",
    "NamespaceWorkerLostError",
    "NewerChangeError",
    "Session",
    "SyncSession",
    "TransferRefusedError",
    "UnsupportedValueError",
    "WorkerBootstrapError",
    "WorkerConfig",
    "WorkerPool",
    "WorkerPoolExhaustedError",
]


def test_the_host_api_is_pinned() -> None:
    assert host.__all__ == HOST_API
    for name in HOST_API:
        assert getattr(host, name) is getattr(importlib.import_module(host._WHERE[name]), name), name


def test_the_lazy_table_and_the_type_checkers_imports_are_in_step() -> None:
    tree = ast.parse(Path(host.__file__).read_text(encoding="utf-8"))
    checked = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    typed = {a.name: n.module for n in checked.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert typed == host._WHERE, "host/__init__.py: the TYPE_CHECKING imports and _WHERE name different things"
    assert sorted(host._WHERE) == host.__all__


def _public_members(cls: type) -> dict[str, Any]:
    """Public methods, properties and static methods the class defines or inherits from the package."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is cls or klass.__module__.startswith("ivralo_kernel"):
            found.update({n: v for n, v in vars(klass).items() if not n.startswith("_")})
    return found


def _instance_attributes(cls: type) -> set[str]:
    """The public attributes ``__init__`` sets (``self.name = ...``), read from its source."""
    tree = ast.parse(inspect.getsource(cls))
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    names = set()
    for node in ast.walk(init):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return {n for n in names if not n.startswith("_")}


def _parameters(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("asynchronous", "blocking"), [(Session, SyncSession), (AttachedSession, SyncAttachedSession)])
def test_the_blocking_twin_has_every_public_member(asynchronous: type, blocking: type) -> None:
    members, twins = _public_members(asynchronous), _public_members(blocking)
    missing = sorted(set(members) - set(twins))
    assert not missing, f"{blocking.__name__} lacks {missing}, which {asynchronous.__name__} has"
    for name, member in members.items():
        twin = twins[name]
        assert type(twin) is type(member), f"{blocking.__name__}.{name} is a {type(twin)}, not a {type(member)}"
        if isinstance(member, staticmethod) or inspect.isfunction(member):
            assert _parameters(twin) == _parameters(member), f"{blocking.__name__}.{name}: not the same parameters"
    attributes = sorted(a for a in _instance_attributes(asynchronous) if not isinstance(twins.get(a), property))
    assert not attributes, f"{blocking.__name__} lacks the attributes {attributes} (a property each)"
    assert _parameters(blocking.__init__) == _parameters(asynchronous.__init__)


@pytest.mark.parametrize("cls", [Session, SyncSession, WorkerPool])
def test_everything_after_workspace_is_given_by_keyword(cls: type) -> None:
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # self
    assert parameters[0].name == "workspace" and parameters[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    positional = [p.name for p in parameters[1:] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    assert not positional, f"{cls.__name__}: {positional} can be passed by position; put them after `*`"


def test_every_parameter_of_session_is_documented() -> None:
    doc = inspect.getdoc(Session) or ""
    for name in inspect.signature(Session.__init__).parameters:
        if name != "self":
            assert f"``{name}``" in doc, f"Session's docstring does not describe the parameter {name}"


def _undocumented(name: str, obj: Any) -> list[str]:
    if not (obj.__doc__ or "").strip() or (inspect.isclass(obj) and "__doc__" not in vars(obj)):
        return [name]
    if not inspect.isclass(obj):
        return []
    missing = []
    for member_name, member in _public_members(obj).items():
        if member_name in vars(obj):
            function = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if callable(function) and not (function.__doc__ or "").strip():
                missing.append(f"{name}.{member_name}")
    return missing


def test_every_public_name_of_the_host_api_has_a_docstring() -> None:
    missing = [m for name in HOST_API for m in _undocumented(name, getattr(host, name))]
    missing += [m for cls in (AttachedSession, SyncAttachedSession) for m in _undocumented(cls.__name__, cls)]
    assert not missing, f"no docstring: {missing}"


def test_the_docstring_check_can_fail() -> None:
    class Bare:
        """Documented, but one method is not."""

        def act(self) -> None:
            pass

    assert _undocumented("Bare", Bare) == ["Bare.act"]


# -- the error tree -------------------------------------------------------------------------------


def _package_errors() -> dict[str, type]:
    """Every IvraloError subclass the package defines (its host and protocol modules loaded)."""
    for path in sorted((PACKAGE / "host").glob("*.py")) + sorted((PACKAGE / "protocol").glob("*.py")):
        if path.stem not in {"__init__", "__main__"}:
            importlib.import_module(f"ivralo_kernel.{path.parent.name}.{path.stem}")
    found: dict[str, type] = {}
    pending = [errors.IvraloError]
    while pending:
        cls = pending.pop()
        if cls.__module__.startswith("ivralo_kernel"):
            assert cls.__name__ not in found or found[cls.__name__] is cls, f"two classes named {cls.__name__}"
            found[cls.__name__] = cls
        pending += cls.__subclasses__()
    return found


def _drawn() -> dict[str, str | None]:
    """errors.py's drawing: class name -> the builtin it names in parentheses (None: none)."""
    drawing = (errors.__doc__ or "").split("::", 1)[1]
    return {m[1]: m[2] for m in re.finditer(r"(?:──\s|^\s+)(\w+)(?:\((\w+)\))?", drawing, re.M)}


def test_every_error_is_drawn_in_the_tree_with_its_builtin() -> None:
    drawn, defined = _drawn(), _package_errors()
    assert set(drawn) == set(defined), (
        f"errors.py's drawing lacks {sorted(set(defined) - set(drawn))}, draws {sorted(set(drawn) - set(defined))}"
    )
    for name, builtin in drawn.items():
        if builtin is not None:
            assert issubclass(defined[name], getattr(builtins, builtin)), f"{name} is drawn as a {builtin}"


def test_every_error_the_host_raises_is_exported_and_an_ivralo_error() -> None:
    exported = {n: getattr(host, n) for n in HOST_API if isinstance(getattr(host, n), type)}
    exported_errors = {n: c for n, c in exported.items() if issubclass(c, BaseException)}
    not_ours = sorted(n for n, c in exported_errors.items() if not issubclass(c, errors.IvraloError))
    assert not not_ours, f"exported but not IvraloErrors: {not_ours}"
    host_errors = {n for n, c in _package_errors().items() if c.__module__.startswith("ivralo_kernel.host")}
    assert host_errors <= set(exported_errors), f"not exported: {sorted(host_errors - set(exported_errors))}"
    kernel_side = {"GuardRefusal", "SecurityError", "TrustGateError", "HermeticImportError", "KernelSpecError"}
    assert kernel_side <= set(protocol.__all__)  # raised in the kernel or by the CLI; the host sees their text


def test_existing_except_clauses_keep_working() -> None:
    from ivralo_kernel.host.history.store import NewerChangeError

    assert issubclass(host.NamespaceTimeoutError, TimeoutError)
    assert issubclass(host.NamespaceWorkerLostError, RuntimeError)
    assert issubclass(host.ArrowMissingError, ImportError)
    assert issubclass(host.UnsupportedValueError, TypeError)
    assert issubclass(host.TransferRefusedError, ValueError)
    assert issubclass(NewerChangeError, host.HistoryError)


def test_security_error_is_defined_once() -> None:
    defined = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == "SecurityError"
    ]
    assert defined == ["protocol/errors.py"], defined


# Strings other code names: older installs' entry point, people's Jupyter configs, a kernel.json
# written by hand. They keep working after host/ moved into sub-rooms.
OLD_NAMES = {
    "ivralo_kernel.host.provisioner": ("IvraloProvisioner", "ivralo_kernel.host.jupyter.provisioner"),
    "ivralo_kernel.host.prompt_websocket": (
        "PromptKernelWebsocketConnection",
        "ivralo_kernel.host.jupyter.prompt_websocket",
    ),
}


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_the_old_import_paths_still_name_the_same_class(old: str) -> None:
    name, new = OLD_NAMES[old]
    assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


def test_the_provisioners_entry_point_loads_it() -> None:
    from importlib.metadata import entry_points

    (point,) = entry_points(group="jupyter_client.kernel_provisioners", name="ivralo-provisioner")
    assert point.load() is importlib.import_module("ivralo_kernel.host.jupyter.provisioner").IvraloProvisioner


def test_the_old_raw_launch_module_runs_the_new_one() -> None:
    shim = PACKAGE / "host" / "raw_launch.py"
    calls = [node for node in ast.walk(ast.parse(shim.read_text())) if isinstance(node, ast.Call)]
    (target,) = [c.args[0].value for c in calls if getattr(c.func, "attr", "") == "run_module"]
    assert target == protocol.names.RAW_LAUNCH_MODULE == "ivralo_kernel.host.jupyter.raw_launch"
    assert callable(importlib.import_module(target).main)


def test_the_names_a_killed_call_assigns_are_read_from_its_code() -> None:
    """What the loss message names as "may also be lost": the names the code binds in the namespace
    (not a function's, class's or comprehension's own locals, not ``_`` names); none for a magic."""
    from ivralo_kernel.host.agent.outputs import assigned_names, lost_names_message

    code = (
        "import os.path, numpy as np\nfrom json import dumps as d\nx, (y, *w) = 1, (2, 3)\nfor i in []: pass\n"
        "with open('f') as fh: pass\ntry: pass\nexcept OSError as e: pass\ndef f(a=(q := 1)):\n    local = 2\n"
        "class C:\n    attr = 1\n[k for k in range(3) if (n := k)]\n_hidden = 1\nv: int = 2\nu += 1\n"
        "if True:\n    inner = 3\nobj.attr = 4\nitems[0] = 5\nmatch 1:\n    case [m, *r]: pass\n    case {**rest}: pass"
    )
    assert assigned_names(code) == [
        "C", "d", "e", "f", "fh", "i", "inner", "m", "n", "np", "os", "q", "r", "rest", "u", "v", "w", "x", "y",
    ]  # fmt: skip
    assert assigned_names("%pip install six") == [] and assigned_names("print(1)") == []
    message = lost_names_message("crash: x", ["a", "x"], ["x", "z"])
    assert "were lost: a, x. The names the stopped call assigns may also be lost: z. You must" in message, message
    assert "may also be lost" not in lost_names_message("crash: x", ["a"], ["a"])
