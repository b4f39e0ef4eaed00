"""[host] The egress policy as the host applies it; the file format lives in ``protocol.egress``."""

from __future__ import annotations

import json
from pathlib import Path

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.egress import PERMISSIONS_FILE, EgressPolicy, load_egress_policy

__all__ = ["EgressPolicy", "allow_always", "load_egress_policy"]


def allow_always(workspace: str, host: str) -> Path:
    """The person answered "always": record the host in the workspace's permissions.json."""
    path = Path(workspace) / names.STATE_DIR / PERMISSIONS_FILE
    data: dict[str, object] = {}
    if path.exists():
        loaded = json.loads(path.read_text(encoding="utf-8"))
        data = loaded if isinstance(loaded, dict) else {}
    hosts = data.setdefault("hosts", {})
    assert isinstance(hosts, dict)
    allow = hosts.setdefault("allow", [])
    assert isinstance(allow, list)
    if host not in allow:
        allow.append(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path
