"""On macOS and Windows every entry point says in one sentence that ivralo needs Linux and what to use
instead, with no traceback. No such machine is here: each is a subprocess whose ``sys.platform`` is
set to the other system's value before ivralo is imported (every check reads it then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
ENTRY_POINTS = {
    "ivralo-kernel install": "from ivralo_kernel.cli import main; raise SystemExit(main(['install']))",
    "ivralo-kernel doctor": "from ivralo_kernel.cli import main; raise SystemExit(main(['doctor']))",
    "the kernelspec's argv": "import runpy; runpy.run_module('ivralo_kernel.supervisor', run_name='__main__')",
    "the kernel": "import runpy; runpy.run_module('ivralo_kernel.kernel', run_name='__main__')",
}


def _as(platform: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = f"import sys; sys.platform = {platform!r}; sys.argv[1:] = ['-f', 'missing.json']\n{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50, cwd=cwd)


@pytest.mark.parametrize(("platform", "system"), [("darwin", "macOS"), ("win32", "Windows")])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_entry_point_says_ivralo_needs_linux(platform: str, system: str, entry: str, tmp_path: Path) -> None:
    done = _as(platform, ENTRY_POINTS[entry], tmp_path)
    assert done.returncode == 2, (entry, done)
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ivralo needs Linux") and f"this is {system}" in line, line
    assert "WSL2" in line and "Linux container" in line, line
    assert not list(tmp_path.iterdir()), "something was written before the platform was checked"


def test_jupyter_loading_the_provisioner_gets_the_same_sentence(tmp_path: Path) -> None:
    code = (
        "try:\n    import ivralo_kernel.host.jupyter.provisioner\n"
        "except ImportError as exc:\n    print(exc)\n    raise SystemExit(3)"
    )
    done = _as("darwin", code, tmp_path)
    assert done.returncode == 3, done
    assert done.stdout.startswith("ivralo needs Linux") and "WSL2" in done.stdout, done.stdout


def test_on_linux_nothing_is_said(tmp_path: Path) -> None:
    done = _as(
        "linux",
        "from ivralo_kernel.protocol.sandbox.platform_support import unsupported; print(unsupported())",
        tmp_path,
    )
    assert done.stdout.strip() == "None", done
