"""[protocol] Reading ivralo's JSON configuration files, one way for all of them: a missing file is
no problem, an unreadable or malformed one is a sentence that names the file (and the line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A settings file is a few lines; the workspace's are written by code in the kernel, so one may be
# any size: the host reads no more than this, and a larger file is a problem, never the host's memory.
MAX_SETTINGS_BYTES = 1 << 20


def read_json_file(path: Path) -> tuple[str | None, Any, str | None]:
    """(text, data, problem); (None, None, None) when the file does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SETTINGS_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):  # a directory is the sandbox's placeholder: no file
        return None, None, None
    except OSError as exc:
        return None, None, f"{path}: cannot be read ({exc.strerror})"
    if len(data) > MAX_SETTINGS_BYTES:
        return None, None, f"{path}: larger than {MAX_SETTINGS_BYTES >> 20} MiB, which no settings file needs"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # the workspace's files hold whatever bytes code wrote there
        line = data[: exc.start].count(b"\n") + 1
        return None, None, f"{path}: line {line}: not UTF-8 text"
    if not text.strip():  # an empty file is the sandbox's placeholder too (databases.json): no file
        return None, None, None
    try:
        return text, json.loads(text), None
    except json.JSONDecodeError as exc:
        return text, None, f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})"
    except RecursionError:
        return text, None, f"{path}: nested too deeply to be a settings file"
