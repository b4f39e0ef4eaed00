"""The static code gate (issue 15, Must 5): one rule engine (protocol/code_gate.py), checked by the host
before a worker is contacted (denied code never starts one) and again in the kernel on every cell."""

from __future__ import annotations

import ast
from pathlib import Path

import psutil
import pytest
from kernel_helpers import execute

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.settings.resolve import IvraloAgent, IvraloSettings
from ivralo_kernel.protocol import KernelPolicy, names
from ivralo_kernel.protocol.code_gate import (
    RULE_ATTRIBUTES,
    RULE_CALLS,
    RULE_MODULES,
    RULE_NAMES,
    RULE_SYNTAX,
    GateRules,
    check_code,
    check_hermetic,
)

fast = pytest.mark.fast
RULES = GateRules()


def rule_of(code: str, rules: GateRules = RULES) -> tuple[str, str, int] | None:
    denial = check_code(code, rules)
    return None if denial is None else (denial.rule, denial.target, denial.line)


# -- the rule engine (no kernel) ---------------------------------------------------------------------
@fast
def test_the_standard_library_is_allowed_and_what_reaches_outside_is_not() -> None:
    assert rule_of("import json, os.path\nfrom collections import deque\nimport sys") is None
    assert rule_of("import numpy") == (RULE_MODULES, "numpy", 1)
    assert rule_of("x = 1\nfrom ctypes import CDLL") == (RULE_MODULES, "ctypes", 2)
    assert rule_of("import subprocess") == (RULE_MODULES, "subprocess", 1)
    widened = GateRules(modules=("stdlib", "numpy", "subprocess"))
    assert rule_of("import numpy.linalg\nimport subprocess", widened) is None
    assert rule_of("import json", GateRules(modules=("numpy",))) == (RULE_MODULES, "json", 1)
    assert rule_of("import anything", GateRules(modules=None)) is None


@fast
def test_names_attributes_and_calls_are_denied_by_rule() -> None:
    assert rule_of("y = eval('1')") == (RULE_NAMES, "eval", 1)
    assert rule_of("f = exec") == (RULE_NAMES, "exec", 1), "a reference, not only a call"
    assert rule_of("get_ipython().system('ls')") == (RULE_NAMES, "get_ipython", 1)
    assert rule_of("().__class__.__bases__[0].__subclasses__()") == (RULE_ATTRIBUTES, "__bases__", 1)
    assert rule_of("g = f.__globals__") == (RULE_ATTRIBUTES, "__globals__", 1)
    assert rule_of("g = getattr(f, '__globals__')") == (RULE_ATTRIBUTES, "__globals__", 1)
    assert rule_of("import os\nos.system('id')") == (RULE_CALLS, "os.system", 2)
    # Through the code's own aliases.
    assert rule_of("import os as o\no.popen('id')") == (RULE_CALLS, "os.popen", 2)
    assert rule_of("from os import system as run\nrun('id')") == (RULE_CALLS, "os.system", 2)
    assert rule_of("import sys\nsys._getframe(1)") == (RULE_CALLS, "sys._getframe", 2)
    # What the gate does not see: a name built at run time (documented as such in docs/security.md).
    assert rule_of("g = getattr(f, '__glo' + 'bals__')") is None
    # The first denial by line is the one reported.
    assert rule_of("import os\nx = 1\nos.system('a')\ny = eval('2')") == (RULE_CALLS, "os.system", 3)


@fast
def test_ipython_syntax_is_denied_and_a_plain_syntax_error_left_to_the_kernel() -> None:
    assert rule_of("x = 1\n!ls") == (RULE_SYNTAX, "!ls", 2)
    assert rule_of("%pip install requests") == (RULE_SYNTAX, "%pip", 1)
    assert rule_of("files = !ls") == (RULE_SYNTAX, "files", 1)
    assert rule_of("def f(:\n    pass") is None, "the kernel reports the SyntaxError itself"


@fast
def test_a_denial_names_the_rule_and_the_setting_that_holds_it() -> None:
    denial = check_code("import os\nos.system('id')", RULES)
    assert denial is not None
    assert denial.message() == (
        "code gate: the call os.system() at line 2 refused before the code ran (rule code_gate_denied_calls: "
        "os.system). Do it another way, or ask the person to change the gate's code_gate_denied_calls setting."
    )
    hermetic = check_hermetic(ast.parse("x = 1\ncompile('1', 'f', 'eval')"))
    assert hermetic is not None and hermetic.target == "compile" and hermetic.line == 2
    assert "exec, eval, compile and __import__" in hermetic.message()
    assert check_hermetic(ast.parse("import os\nos.getcwd()")) is None


@fast
def test_the_gate_is_off_by_default_and_its_settings_reach_the_policy() -> None:
    assert IvraloSettings().gate_rules() is None, "off by default for people"
    assert IvraloAgent().gate_rules() is None, "and for agents, unless they want it"
    rules = WorkerConfig(code_gate=True, code_gate_modules=["stdlib", "numpy"]).settings.gate_rules()
    assert rules == GateRules(modules=("stdlib", "numpy"))
    policy = KernelPolicy(workspace="/w", code_gate=rules)
    assert KernelPolicy.from_json(policy.to_json()) == policy
    # A raw launch (VS Code) carries it in kernel.json's env.
    env = {names.ENV_CODE_GATE: "on", names.ENV_CODE_GATE_MODULES: "stdlib,numpy", names.ENV_CODE_GATE_DENIED_CALLS: ""}
    raw = KernelPolicy.from_env(env, "/w").code_gate
    assert raw == GateRules(modules=("stdlib", "numpy"), denied_calls=())
    assert KernelPolicy.from_env({}, "/w").code_gate is None


@fast
async def test_denied_code_never_starts_a_worker(workspace: Path) -> None:
    """Checked on the host before the worker is contacted. The fast tier's audit hook fails this test
    if any process starts (subprocess, posix_spawn, fork+exec); the pids are counted here too."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    async with Session(workspace=workspace, config=WorkerConfig(code_gate=True)) as session:
        for code in ("import ctypes", "x = eval('1')", "import os\nos.system('true')", "!ls"):
            result = await session.run(code)
            assert isinstance(result, dict), code
            assert result["status"] == "done_with_errors" and result["result"] == ""
            assert result["error"].startswith("SecurityError: code gate: ") and "(rule code_gate_" in result["error"]
        assert session.pid is None and session._worker is None, "no worker was started"
        assert session._pool.live == 0
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after == before, f"processes started: {after - before}"


# -- with a kernel ---------------------------------------------------------------------------------
async def test_allowed_code_runs_and_the_kernel_checks_again(workspace: Path) -> None:
    """A client that skips the host's check (here: the session's own client, used directly) meets the
    same rules in the kernel, before the cell runs."""
    config = WorkerConfig(code_gate=True, code_gate_modules=["stdlib"])
    async with Session(workspace=workspace, config=config) as session:
        assert await session.run("import json\nmarks = []\nprint(json.dumps([1]))") == "[1]\n"
        assert session.kernel_info["ivralo"]["layers"]["code_gate"].startswith("on")
        worker = session._worker
        assert worker is not None
        # stop_on_error=False: the refusal is an error, and ipykernel would abort the next request
        # if it came in while the kernel still aborts (a race on a loaded machine).
        msg_id = worker.kc.execute("marks.append(1)\nimport ctypes", stop_on_error=False)
        reply = await _reply(worker.kc, msg_id)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "SecurityError"
        assert "rule code_gate_modules: ctypes" in reply["content"]["evalue"]
        assert await session.run("print(len(marks))") == "0\n", "nothing of the refused cell ran"
        # The session's namespace API still works under the gate (set_var, reset avoid what it denies).
        await session.set_var("y", {"a": 1})
        assert await session.get_var("y") == {"a": 1}
        await session.reset()
        assert await session.list_vars() == []


def test_a_kernelspec_with_the_gate_refuses_in_the_kernel(workspace: Path, tmp_path: Path) -> None:
    """A kernel started by a Jupyter host (the provisioner's settings in kernel.json): the kernel's check."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    from ivralo_kernel.cli.install import install

    prefix = tmp_path / "prefix"
    install(prefix=str(prefix), name="ivralo-gated", provisioner_config={"code_gate": True})
    kernels = prefix / "share" / "jupyter" / "kernels"
    km = KernelManager(kernel_name="ivralo-gated", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    km.start_kernel(cwd=str(workspace))
    try:
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            refused = execute(kc, "print('ran')\nglobals()")
            assert refused.status == "error" and refused.stdout == ""
            shown = "\n".join(refused.reply["content"]["traceback"])
            assert shown.startswith("SecurityError: code gate: the name 'globals' at line 2"), shown
        finally:
            kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


async def _reply(kc: object, msg_id: str) -> dict[str, object]:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reply: dict[str, object] = await kc.get_shell_msg(timeout=deadline - time.monotonic())  # type: ignore[attr-defined]
        if reply["parent_header"]["msg_id"] == msg_id:  # type: ignore[index]
            return reply
    raise AssertionError("no reply")
