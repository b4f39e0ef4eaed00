"""Where ``!pip``, ``!python -m pip`` and ``!uv pip`` would install (issue 31, Must 4), read from the
shell line as the tools decide it (no process; the real kernel's refusal is in test_frontend_features.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ivralo_kernel.kernel.shell_pip import install_target, simple_commands

pytestmark = pytest.mark.fast


def test_the_simple_commands_of_a_line() -> None:
    assert simple_commands("FOO=1 sudo pip install x && echo 'pip install y' | tee log; ls") == [
        ["pip", "install", "x"],
        ["echo", "pip install y"],
        ["tee", "log"],
        ["ls"],
    ]
    assert simple_commands("pip install 'unclosed") == []  # the shell says what is wrong


def test_where_each_install_would_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = str(Path(sys.executable).parent.parent)
    # A pip script names its interpreter on its #! line: that interpreter's environment.
    pip = tmp_path / "other" / "bin" / "pip"
    pip.parent.mkdir(parents=True)
    pip.write_text(f"#!{sys.executable}\nimport sys\n")
    pip.chmod(0o755)
    assert install_target([str(pip), "-q", "install", "x"]) == ("!pip install", env)
    assert install_target([str(pip), "uninstall", "-y", "x"]) == ("!pip uninstall", env)
    assert install_target([sys.executable, "-m", "pip", "install", "x"]) == ("!python -m pip install", env)
    assert install_target(["pip", "--python", "/opt/e/bin/python", "install", "x"]) == ("!pip install", "/opt/e")
    monkeypatch.chdir(tmp_path)
    assert install_target(["pip", "install", "--target", "pkgs", "x"]) == ("!pip install", str(tmp_path / "pkgs"))
    assert install_target(["pip", "install", "--prefix=/opt/p", "x"]) == ("!pip install", "/opt/p")
    # Nothing that changes an environment, or not pip at all.
    assert install_target(["pip", "list"]) is None and install_target(["pip", "--version"]) is None
    assert install_target(["pipx", "install", "x"]) is None and install_target(["python", "x.py"]) is None
    # uv: --python, VIRTUAL_ENV, else a .venv here or above; unknown (a version request, no venv): None.
    assert install_target(["uv", "pip", "install", "--python", sys.executable, "x"]) == ("!uv pip install", env)
    assert install_target(["uv", "pip", "install", "-p", "3.12", "x"]) is None
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    if not any((Path(p) / ".venv" / "pyvenv.cfg").is_file() for p in (tmp_path, *tmp_path.parents)):
        assert install_target(["uv", "pip", "install", "x"]) is None
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert install_target(["uv", "pip", "install", "x"]) == ("!uv pip install", str(tmp_path / ".venv"))
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/venv")
    assert install_target(["uv", "pip", "install", "x"]) == ("!uv pip install", "/opt/venv")
