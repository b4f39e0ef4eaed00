"""[guards] Remove credentials from ``os.environ`` (changes process state).

The supervisor already started the kernel with a clean exec-time environment; this pass covers a
kernel launched some other way, and runs again after the workspace ``.env`` is loaded into
``os.environ``. ``del os.environ[k]`` also unsets the variable for children started later.
"""

from __future__ import annotations

import os

from ivralo_kernel.protocol import database_env_names
from ivralo_kernel.protocol.credentials import ScrubRule, is_secret


def scrub_environ(workspace: str) -> tuple[list[str], list[str]]:
    """Delete credential variables. Returns (names removed, problems reading databases.json)."""
    db_names, problems = database_env_names(workspace, os.environ)
    rule = ScrubRule.load(os.environ)
    removed = sorted(k for k, v in os.environ.items() if is_secret(k, v, db_names, rule))
    for key in removed:
        del os.environ[key]
    return removed, problems
