"""``jupyter console`` driven as a person types, through a pty (pexpect)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect

JUPYTER = Path(sys.executable).parent / "jupyter"


@contextlib.contextmanager
def jupyter_console(
    kernel_name: str, cwd: Path, first_cell: bool = True, env: dict[str, str] | None = None
) -> Iterator[pexpect.spawn]:
    """A console at its first prompt (``first_cell``: at its second, after ``1 + 1``, as a person
    starts: jupyter console ends its wait for a cell's input requests at any "idle" of its own
    session, and one left over from its start-up requests can come first). A timeout fails with the
    screen so far; the console is closed afterwards. ``env``: variables added to the console's."""
    child = pexpect.spawn(
        str(JUPYTER),
        ["console", "--kernel", kernel_name, "--simple-prompt"],
        cwd=str(cwd),
        env=dict(os.environ, **(env or {}), TERM="dumb"),
        encoding="utf-8",
        timeout=60,
    )
    try:
        child.expect(r"In \[1\]: ")
        if first_cell:
            child.sendline("1 + 1")
            child.expect(r"Out\[1\]: 2")
            child.expect(r"In \[2\]: ")
        yield child
    except pexpect.TIMEOUT:
        raise AssertionError(f"jupyter console did not get there; the screen so far: {child.before!r}") from None
    finally:
        child.close(force=True)
