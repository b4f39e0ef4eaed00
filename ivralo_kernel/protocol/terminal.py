"""[protocol] Text from the kernel, made safe to print on a person's terminal (stdlib only).

A file name, a host, a message: anything code in the kernel chose can hold ``ESC ] ... BEL`` (a
terminal's title, a hyperlink, on some terminals the clipboard), ``ESC [ 2J`` (clear the screen), a
carriage return or newline that forges a line of ivralo's own output, or U+202E, which shows the rest
of a line reversed. ``terminal_safe`` keeps every printable character, any script's, and writes each
of these as a visible escape instead: ``\\x1b``, ``\\n``, ``\\u202e``. One function, used by every
place that prints what the kernel wrote: ``history``, ``run``, ``doctor`` and the host's log lines.
"""

from __future__ import annotations

import re

# C0 controls, DEL and C1 controls (an 8-bit CSI, U+009B, is a CSI to many terminals); the bidi
# embeddings, overrides, isolates and marks; the line and paragraph separators; and lone surrogates
# (a file name's undecodable bytes, which print as an exception rather than as text).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
# The same, but for text of several lines: tab (0x09) and newline (0x0a) pass.
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _NAMED:
        return _NAMED[char]
    if code < 0x100:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's stand-in for one undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def terminal_safe(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control, bidi override and lone surrogate written as a visible escape.
    ``keep_newlines``: a message of several lines (a cell's output) keeps its newlines and tabs, and
    nothing else: a carriage return could still overwrite the line before it."""
    if keep_newlines:
        return _UNSAFE_IN_LINES.sub(_escape, str(text))
    return _UNSAFE.sub(_escape, str(text))
