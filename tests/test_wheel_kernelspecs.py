"""The wheel ships both kernelspecs (issue 31, Must 10): ``ivralo`` and ``ivralo-hermetic``, each as
``ivralo-kernel install`` writes it, with ``python`` as argv[0] (the host's interpreter, where the wheel is
installed); an editable install's name its own interpreter, never a bare ``python``. Built for real,
with pip, from this checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ivralo_kernel.cli.install import install

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("ivralo", "ivralo-hermetic")
LABEXT = "ivralo-labextension"
SERVER_SWITCH = "etc/jupyter/jupyter_server_config.d/ivralo-kernel.json"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "-q", *args], cwd=ROOT, check=True, timeout=240, capture_output=True)


def installed_spec(tmp_path: Path, hermetic: bool) -> dict[str, object]:
    folder = install(prefix=str(tmp_path / "ref"), surface="hermetic" if hermetic else "project")
    return dict(json.loads((Path(folder) / "kernel.json").read_text()))


@pytest.mark.timeout(300)
def test_the_wheel_and_an_editable_install_ship_both_kernelspecs(tmp_path: Path) -> None:
    pip("wheel", ".", "--no-deps", "-w", str(tmp_path / "dist"))
    (wheel,) = (tmp_path / "dist").glob("ivralo_kernel-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        data = f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.data/data/share/jupyter/kernels"
        shipped = {name: json.loads(archive.read(f"{data}/{name}/kernel.json")) for name in NAMES}
        # The JupyterLab extension, prebuilt (issue 32), and the switch of its server side.
        root = data.removesuffix("share/jupyter/kernels")
        names = set(archive.namelist())
        labext = f"{root}share/jupyter/labextensions/{LABEXT}"
        assert json.loads(archive.read(f"{labext}/package.json"))["name"] == LABEXT
        assert any(n.startswith(f"{labext}/static/remoteEntry.") for n in names), sorted(names)
        assert f"{root}{SERVER_SWITCH}" in names
    for name, spec in shipped.items():
        expected = installed_spec(tmp_path, hermetic=name == "ivralo-hermetic")
        assert spec["argv"][0] == "python", spec
        assert spec["argv"][1:] == expected["argv"][1:], name  # type: ignore[index]
        assert {k: v for k, v in spec.items() if k != "argv"} == {k: v for k, v in expected.items() if k != "argv"}

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    pip("--python", str(env / "bin" / "python"), "install", "--no-deps", "-e", ".")
    for name in NAMES:
        spec = json.loads((env / "share" / "jupyter" / "kernels" / name / "kernel.json").read_text())
        assert spec["argv"][0] == str(env / "bin" / "python"), (name, spec["argv"])
    assert (env / "share" / "jupyter" / "labextensions" / LABEXT / "package.json").is_file()
    assert (env / SERVER_SWITCH).is_file()
