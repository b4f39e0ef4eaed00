"""[protocol] Which folders the person trusts: a JSON file in the config home, never in a workspace.

Written only by ``ivralo-kernel trust`` / ``untrust`` (in the person's shell); read by the host and
the kernel. The kernel's write guard refuses writes outside the workspace, so code in a kernel
cannot grant itself trust.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ivralo_kernel.protocol.credentials import config_home

TRUST_FILE = "trusted-folders.json"


def trust_file(env: Mapping[str, str]) -> Path:
    return config_home(env) / TRUST_FILE


def trusted_folders(env: Mapping[str, str]) -> list[str]:
    try:
        data = json.loads(trust_file(env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    folders = data.get("trusted") if isinstance(data, dict) else None
    return [f for f in folders if isinstance(f, str)] if isinstance(folders, list) else []


def is_trusted(folder: str, env: Mapping[str, str]) -> bool:
    """A folder is trusted when it, or a folder above it, was trusted."""
    target = os.path.realpath(folder)
    for entry in trusted_folders(env):
        root = os.path.realpath(entry)
        if target == root or target.startswith(root.rstrip(os.sep) + os.sep):
            return True
    return False


def set_trust(folder: str, trusted: bool, env: Mapping[str, str]) -> Path:
    """Add or remove ``folder`` (resolved); returns the file written."""
    target = os.path.realpath(folder)
    folders = [f for f in trusted_folders(env) if os.path.realpath(f) != target]
    if trusted:
        folders.append(target)
    path = trust_file(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"trusted": sorted(folders)}, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
