"""[host] Turn a cell's IOPub messages into the agent contract: a ``str``, or an error dict."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass
class CellOutput:
    """Accumulates what a person would have seen under the cell, as plain text."""

    parts: list[str] = field(default_factory=list)
    error: str | None = None

    def add(self, msg: dict[str, Any]) -> None:
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream":
            self.parts.append(content.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = content.get("data", {}).get("text/plain")
            if text is not None:
                self.parts.append(text if text.endswith("\n") else text + "\n")
        elif kind == "error":
            lines = content.get("traceback") or [f"{content.get('ename')}: {content.get('evalue')}"]
            self.error = strip_ansi("\n".join(lines))
        elif kind == "clear_output":
            self.parts.clear()

    @property
    def text(self) -> str:
        return strip_ansi("".join(self.parts))


def error_result(result: str, error: str, status: str = "error") -> dict[str, str]:
    return {"status": status, "result": result, "error": error}


def lost_names_message(cause: str, lost: list[str]) -> str:
    names = ", ".join(lost) if lost else "(none were defined)"
    return (
        f"REPL worker terminated ({cause}). ALL variables in this session were lost: {names}. "
        "You must recreate any state you need before retrying."
    )
