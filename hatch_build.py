"""Build hook: the wheel's two kernelspecs, ``ivralo`` and ``ivralo-hermetic``, from kernelspec/kernel.json.

A wheel's argv is ``python``, which jupyter_client replaces with the interpreter of the host that
starts it (the environment the wheel is installed in, where the kernelspec is found) and VS Code runs
in that environment, activated. An editable install's argv is the installing interpreter itself (as
ipykernel's build does), so that ``pip install -e .`` never leaves a bare ``python`` behind that
another environment's host would resolve to itself; where that interpreter is a build backend's
throwaway environment (uv's isolated builds), no kernelspec is shipped: ``ivralo-kernel install``
writes one (the Makefile runs it after every install)."""

from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HERE = Path(__file__).parent
TEMPLATE = HERE / "kernelspec"
OUT = HERE / "build" / "kernelspecs"


def kernelspecs(python: str) -> dict[str, dict[str, Any]]:
    """Each kernelspec's kernel.json, with ``python`` as its interpreter."""
    base = json.loads((TEMPLATE / "kernel.json").read_text(encoding="utf-8"))
    base["argv"][0] = python
    hermetic = copy.deepcopy(base)
    hermetic["display_name"] = "Python (ivralo, hermetic)"
    hermetic["env"] = {"IVRALO_SURFACE": "hermetic"}
    hermetic["metadata"]["kernel_provisioner"]["config"] = {"surface": "hermetic"}
    return {"ivralo": base, "ivralo-hermetic": hermetic}


def throwaway(prefix: str) -> bool:
    """An interpreter that will not exist after the build: an isolated build's own environment (uv's
    ``builds-v0/``, ``python -m build``'s ``build-env-*``; pip's isolation keeps the target interpreter)."""
    return any(part.startswith(("builds-v", "build-env-")) for part in Path(prefix).resolve().parts)


class KernelspecHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "standard":
            python = "python"
        elif throwaway(sys.prefix):
            return
        else:
            python = sys.executable
        for name, spec in kernelspecs(python).items():
            folder = OUT / name
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            (folder / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
            shutil.copy2(TEMPLATE / "logo-svg.svg", folder / "logo-svg.svg")
            build_data["shared_data"][str(folder.relative_to(HERE))] = f"share/jupyter/kernels/{name}"
