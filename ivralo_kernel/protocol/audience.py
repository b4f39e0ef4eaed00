"""[protocol] Who reads the kernel's refusals: a person at a notebook or console, or an agent's tool.

A refusal names what was refused and why for both. The sentence for an agent ("stop and tell the
person, rather than looking for another way") is dropped for a person, who *is* that person; and
where the next step differs (an agent's edit_file tool, a person's own editor), each gets theirs.
The kernel learns its audience from its launch policy (``KernelPolicy.audience``): a notebook's
kernel speaks to a person unless an agent's host says otherwise.
"""

from __future__ import annotations

from typing import Final

PERSON: Final = "person"
AGENT: Final = "agent"
AUDIENCES: Final = (PERSON, AGENT)
TELL_THE_PERSON: Final = "Stop and tell the person, rather than looking for another way."

_current = [PERSON]  # the process's one audience, set once at launch


def set_audience(audience: str) -> None:
    if audience not in AUDIENCES:
        raise ValueError(f"audience must be one of {', '.join(AUDIENCES)}, got {audience!r}")
    _current[0] = audience


def current() -> str:
    return _current[0]


def for_audience(*, person: str, agent: str) -> str:
    return agent if _current[0] == AGENT else person


def addressed(text: str) -> str:
    """``text`` as its reader should see it: for a person, the sentence meant for an agent goes."""
    if _current[0] == AGENT:
        return text
    return " ".join(text.replace(TELL_THE_PERSON, "").split(" ")).replace("  ", " ").strip()
