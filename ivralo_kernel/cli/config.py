"""[cli] ``ivralo-kernel config``: every setting's effective value and where it came from, for the
kernels Jupyter's hosts start (JupyterLab, console, VS Code) and for the agent API's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

from ivralo_kernel.host.settings.resolve import (
    Effective,
    IvraloAgent,
    JupyterHostSettings,
    Layer,
    command_line_layer,
    config_file_layers,
    resolve,
    section_of,
)
from ivralo_kernel.protocol import names


def kernelspec_layer(kernel_name: str) -> tuple[Layer | None, str]:
    """The installed kernelspec's provisioner config (written by ``install``), and where it is."""
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        return None, f"no kernelspec named {kernel_name!r} is installed (ivralo-kernel install)"
    provisioner = spec.metadata.get("kernel_provisioner") or {}
    if provisioner.get("provisioner_name") != names.PROVISIONER_NAME:
        return None, f"kernelspec {kernel_name!r} ({spec.resource_dir}) does not use the ivralo provisioner"
    label = f"kernel.json ({spec.resource_dir})"
    return Layer(label, section_of(provisioner.get("config") or {}, "IvraloProvisioner")), label


def effective_settings(argv: Sequence[str], kernel_name: str) -> tuple[dict[str, Effective], list[str]]:
    files = config_file_layers()
    cli = command_line_layer(argv)
    spec, where = kernelspec_layer(kernel_name)
    notes = [f"config files read: {', '.join(layer.label for layer in files) or 'none'}", f"kernelspec: {where}"]
    jupyter_layers = [*files, cli, *([spec] if spec else [])]
    return {
        "jupyter": resolve(JupyterHostSettings, jupyter_layers),
        "agent": resolve(IvraloAgent, [*files, cli]),
    }, notes


def _shown(value: Any, room: int = 40) -> str:
    text = json.dumps(value) if isinstance(value, (list, str)) else str(value)
    return text if len(text) <= room else text[: room - 4] + " ..."  # --json has it whole


def show_config(argv: Sequence[str], kernel_name: str = names.KERNEL_NAME, as_json: bool = False) -> int:
    hosts, notes = effective_settings(argv, kernel_name)
    if as_json:
        report = {kind: {n: {"value": v, "from": src} for n, v, src in e.rows()} for kind, e in hosts.items()}
        print(json.dumps({"notes": notes, **report}, indent=1))
        return 0
    for note in notes:
        print(note)
    titles = {
        "jupyter": f"Kernels Jupyter's hosts start from kernelspec {kernel_name!r} (JupyterLab, console, VS Code)",
        "agent": "Kernels of the agent API (Session, WorkerPool, doctor)",
    }
    for kind, effective in hosts.items():
        rows = effective.rows()
        width = max(len(name) for name, _, _ in rows)
        values = [_shown(value) for _, value, _ in rows]
        value_width = min(40, max(len(v) for v in values))
        print(f"\n{titles[kind]}:")
        for (name, _, source), value in zip(rows, values, strict=True):
            print(f"  {name:<{width}}  {value:<{value_width}}  {source}")
    print(
        "\n`ivralo-kernel run` gets the first list's values without kernel.json's, then its own flags."
        "\nJupyterLab's own config (jupyter_server_config) can also set c.IvraloProvisioner.*; it applies there "
        "between these files and kernel.json."
    )
    return 0
