"""[protocol] Reading ivralo's JSON configuration files, one way for all of them: a missing file is
no problem, an unreadable or malformed one is a sentence that names the file (and the line).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_file(path: Path) -> tuple[str | None, Any, str | None]:
    """(text, data, problem); (None, None, None) when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):  # a directory is the sandbox's placeholder: no file
        return None, None, None
    except OSError as exc:
        return None, None, f"{path}: cannot be read ({exc.strerror})"
    if not text.strip():  # an empty file is the sandbox's placeholder too (databases.json): no file
        return None, None, None
    try:
        return text, json.loads(text), None
    except json.JSONDecodeError as exc:
        return text, None, f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})"
