"""[host] The start's lines about settings files that cannot be used as they are (a workspace's
``.ivralo/permissions.json`` or ``databases.json``, the config home's): each names the file, the
line and what to do. The file is set aside (or the entry in it), and the kernel starts all the same:
a bad file is the person's to fix, never a reason for no kernel at all."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.network.egress import PERMISSIONS_FILE, read_permissions

WHAT_TO_DO = "it was set aside: fix it, then restart the kernel"


def settings_file_lines(workspace: str, database_problems: Iterable[str], permissions_usable: bool) -> list[str]:
    """One line per problem: the databases files' (already read by the caller, for the scrub) and
    the workspace's permissions.json's, unless the host set that file aside already (config_watch)."""
    path = Path(workspace, names.STATE_DIR, PERMISSIONS_FILE)
    permission_problems = read_permissions(path)[1] if permissions_usable else []
    return [f"{problem}; {WHAT_TO_DO}" for problem in [*database_problems, *permission_problems]]
