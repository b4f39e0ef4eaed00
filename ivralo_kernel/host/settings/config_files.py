"""[host] Where the person's ivralo settings files are: ``jupyter_ivralo_config.py`` / ``.json`` on
Jupyter's config path. Kept apart from the settings model so that a raw launch, which starts on
every VS Code kernel, pays for traitlets only when such a file exists."""

from __future__ import annotations

import os
from collections.abc import Sequence

CONFIG_FILE = "jupyter_ivralo_config"
SUFFIXES = (".py", ".json")


def config_files(paths: Sequence[str] | None = None) -> list[str]:
    """The files that exist, the weakest first (the system's, the environment's, then the user's).
    Never the current folder: for a kernel that is the workspace, which code in the kernel writes."""
    if paths is None:
        from jupyter_core.paths import jupyter_config_path

        paths = jupyter_config_path()  # the strongest first
    found = []
    for folder in reversed(list(paths)):
        for suffix in SUFFIXES:
            path = os.path.join(folder, CONFIG_FILE + suffix)
            if os.path.isfile(path):
                found.append(path)
    return found
