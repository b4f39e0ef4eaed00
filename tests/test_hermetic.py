"""The hermetic surface (issue 15, Must 1): the standard library and ivralo's helpers only, no exec,
eval, compile or __import__, writes to the scratch folder only, no %pip; the kernelspec
``ivralo-hermetic`` and ``Session(surface="hermetic")``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client.manager import KernelManager
from kernel_helpers import execute

from ivralo_kernel.cli.app import main
from ivralo_kernel.host import ConfigError, Session, WorkerConfig, WorkerPool
from ivralo_kernel.protocol import KernelPolicy, names
from ivralo_kernel.protocol.errors import hermetic_import_message

fast = pytest.mark.fast
SURFACES_SENTENCE = (
    'Installed packages are on the project surface: switch to the ivralo kernel, or use Session(surface="project").'
)


async def test_a_hermetic_session(workspace: Path) -> None:
    """One worker for every check: starting kernels is what costs here."""
    async with Session(workspace=workspace, surface="hermetic") as s:
        assert s.surface == names.SURFACE_HERMETIC
        # The standard library, and the helpers (already in the namespace as `ivralo`, importable too).
        assert await s.run("import json, os, re, tempfile, collections\nprint(json.dumps({'a': 1}))") == '{"a": 1}\n'
        assert await s.run("import ivralo\nprint(ivralo.call.__name__)") == "call\n"
        assert s.kernel_info["ivralo"]["surface"] == "hermetic"

        # A third-party module: refused with the sentence that names both surfaces and how to switch,
        # loaded by the kernel already (zmq) or not (httpx), by a statement, from a function defined in
        # a cell, or through importlib.
        for code, module in (
            ("import zmq", "zmq"),
            ("from httpx import Client", "httpx"),
            ("def load():\n    import traitlets\nload()", "traitlets"),
            ("import importlib\nimportlib.import_module('httpx')", "httpx"),
        ):
            result = await s.run(code)
            assert isinstance(result, dict) and result["status"] == "error", code
            assert f"HermeticImportError: {hermetic_import_message(module)}" in result["error"], result
            assert SURFACES_SENTENCE in result["error"]
        # Code that falls back when a module is missing keeps working.
        assert await s.run("try:\n    import zmq\nexcept ModuleNotFoundError:\n    print('fallback')") == "fallback\n"

        # eval, exec, compile, __import__: refused before the cell runs (the line before did not run).
        await s.run("marks = []")
        for builtin, call in (
            ("eval", "eval('1 + 1')"),
            ("exec", "exec('y = 1')"),
            ("compile", "compile('1', '<s>', 'eval')"),
            ("__import__", "__import__('json')"),
        ):
            result = await s.run(f"marks.append('{builtin}')\n{call}")
            assert isinstance(result, dict) and result["status"] == "done_with_errors", result
            assert result["error"].startswith(
                f"SecurityError: hermetic surface: the builtin {builtin} at line 2 refused before the code ran "
                f"(rule hermetic_builtins: {builtin};"
            ), result["error"]
        assert await s.run("print(marks)") == "[]\n", "no line of a refused cell ran"

        # Writes: refused in the workspace, allowed in the scratch folder (the kernel's own TMPDIR).
        result = await s.run("open('notes.txt', 'w').write('x')")
        assert isinstance(result, dict) and "the hermetic surface writes only to its scratch folder" in result["error"]
        assert not (workspace / "notes.txt").exists()
        scratch = "import os, tempfile\np = os.path.join(tempfile.gettempdir(), 'n.txt')\nopen(p, 'w').write('ok')\n"
        assert await s.run(scratch + "print(open(p).read())") == "ok\n"

        # A child process too, where the Landlock floor is in force (the floor is the scratch folder).
        if s.kernel_info["ivralo"]["layers"]["landlock"].startswith("ABI"):
            touched = await s.run("import subprocess\nprint(subprocess.run(['touch', 'child.txt']).returncode)")
            assert touched == "1\n" and not (workspace / "child.txt").exists()

        # No package installs: %pip says which surface has them.
        result = await s.run("%pip install six")
        assert isinstance(result, dict) and "%pip is not available on the hermetic surface" in result["error"]
        result = await s.run("%uv pip install six")  # nor through IPython's %uv
        assert isinstance(result, dict) and "%pip is not available on the hermetic surface" in result["error"]

        # The namespace API works on this surface.
        await s.set_var("v", [1, 2])
        assert await s.get_var("v") == [1, 2]


def test_the_ivralo_hermetic_kernelspec(workspace: Path) -> None:
    """What a person starts from JupyterLab's launcher: the same surface, through the provisioner."""
    km = KernelManager(kernel_name=names.HERMETIC_KERNEL_NAME)
    km.start_kernel(cwd=str(workspace))
    try:
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            info = kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]
            assert info["surface"] == "hermetic" and info["layers"]["surface"] == "hermetic"
            assert execute(kc, "import statistics\nprint(statistics.mean([1, 3]))").stdout == "2\n"
            refused = execute(kc, "import traitlets")
            assert refused.status == "error" and refused.reply["content"]["ename"] == "HermeticImportError"
            assert hermetic_import_message("traitlets") in refused.reply["content"]["evalue"]
        finally:
            kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


@fast
def test_install_writes_both_surfaces(tmp_path: Path) -> None:
    assert main(["install", "--prefix", str(tmp_path)]) == 0
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    project = json.loads((kernels / "ivralo" / "kernel.json").read_text(encoding="utf-8"))
    hermetic = json.loads((kernels / "ivralo-hermetic" / "kernel.json").read_text(encoding="utf-8"))
    assert project["display_name"] == names.DISPLAY_NAME and names.ENV_SURFACE not in project["env"]
    assert hermetic["display_name"] == names.HERMETIC_DISPLAY_NAME
    assert hermetic["metadata"]["kernel_provisioner"]["config"] == {"surface": "hermetic"}
    assert hermetic["env"] == {names.ENV_SURFACE: "hermetic"}, "a raw launch (VS Code) gets it too"
    # --surface or --name: one spec.
    other = tmp_path / "other"
    assert main(["install", "--prefix", str(other), "--surface", "hermetic", "--name", "h"]) == 0
    assert sorted(p.name for p in (other / "share" / "jupyter" / "kernels").iterdir()) == ["h"]


@fast
def test_the_surface_is_one_setting(workspace: Path) -> None:
    assert WorkerConfig().surface == "project"
    assert KernelPolicy.from_env({names.ENV_SURFACE: "hermetic"}, "/w").surface == "hermetic"
    with pytest.raises(ConfigError, match="surface: 'sealed' is not one of project, hermetic"):
        Session(workspace=workspace, surface="sealed")
    pool = WorkerPool(workspace)
    with pytest.raises(ConfigError, match="differs from the pool's surface 'project'"):
        Session(pool=pool, surface="hermetic")
    assert Session(pool=WorkerPool(workspace, config=WorkerConfig(surface="hermetic"))).surface == "hermetic"


async def test_tables_on_the_hermetic_surface_point_to_the_project_one(workspace: Path) -> None:
    """pyarrow and pandas are installed, but not on this surface: the error says which surface has them."""
    import pandas as pd

    from ivralo_kernel.host import Session
    from ivralo_kernel.host.agent.dataplane import ArrowMissingError

    async with Session(workspace=workspace, surface="hermetic") as session:
        with pytest.raises(ArrowMissingError, match="the hermetic surface does not offer"):
            await session.inject_dataframe("df", pd.DataFrame({"a": [1, 2]}))
        assert await session.run("print('still here')") == "still here\n"
