"""[kernel] Who decides whether code may reach a host: the host side, over the broker.

The host judges with the allow list and, for an unknown host, asks somebody: an agent's ``ask``
callback (the host does that itself), or the person at the notebook or console. The person is
only reachable through this cell's stdin channel, so then the host answers "ask the person", the
kernel shows an input prompt like ``input()`` does, and relays the answer back to the host, which
decides and records it. Without a host (a raw launch), the allow list alone decides and nobody is
asked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ivralo_kernel.kernel.broker_client import BROKER, BrokerUnavailable
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.egress import load_egress_policy

# Asking a person may take a while; the host pauses the cell's deadline meanwhile.
EGRESS_ANSWER_TIMEOUT_S = 600.0
PROMPT_ATTEMPTS = 3  # an answer that is none of the choices is asked again, this many times in all

Decision = tuple[bool, str]


def egress_judge(workspace: str) -> Callable[[str, int | None], Decision]:
    def judge(host: str, port: int | None) -> Decision:
        person = BROKER.person
        payload = {"host": host, "port": port, "person": person is not None and person.available()}
        try:
            answer = BROKER.ask(names.BROKER_EGRESS, payload, EGRESS_ANSWER_TIMEOUT_S, pause_deadline=True)
            if answer.get("ask_person") and person is not None:
                choice = _prompt(person, answer)
                answer = BROKER.ask(
                    names.BROKER_EGRESS_ANSWER,
                    {"host": host, "port": port, "choice": choice},
                    EGRESS_ANSWER_TIMEOUT_S,
                    pause_deadline=True,
                )
        except BrokerUnavailable:
            allowed, reason = load_egress_policy(workspace, os.environ).judge(host, port)
            return (True, reason) if allowed else (False, "no ivralo host is attached to ask")
        except TimeoutError:
            return False, "the ivralo host did not answer"
        return bool(answer.get("allowed")), str(answer.get("reason") or "refused by the host")

    return judge


def answer_proxy_question(content: dict[str, Any]) -> None:
    """(its own thread) The host's egress proxy met an unknown host, asked for by this cell's code or
    by a subprocess of it (curl, pip): show the question at the cell's input prompt and relay the
    answer, as for the guard's own questions."""
    person = BROKER.person
    host, port = str(content.get("host")), content.get("port")
    payload: dict[str, Any] = {"host": host, "port": port}
    if person is None or not person.available():
        payload.update(choice="no", unavailable=True)
    else:
        try:
            payload["choice"] = _prompt(person, content)
        except Exception:  # noqa: BLE001 - an interrupted or refused prompt is a "no"
            payload["choice"] = "no"
    # The cell's "hosts tried" line gets the host's decision (ivralo_egress_note), taken before the
    # connection goes on.
    with contextlib.suppress(BrokerUnavailable, TimeoutError):
        BROKER.ask(names.BROKER_EGRESS_ANSWER, payload, EGRESS_ANSWER_TIMEOUT_S)


def prompt_text(question: str, choices: Sequence[str]) -> str:
    """What the person reads at the cell's input prompt (the README's screenshot shows it)."""
    return f"{question}. Allow? [{'/'.join(choices)}] "


def _prompt(person: Any, answer: Mapping[str, Any]) -> str:
    """Ask at the cell's input prompt until the answer is one of the choices (or a prefix of one)."""
    choices = [c for c in answer.get("choices") or () if c in names.EGRESS_CHOICES] or ["yes", "no"]
    question = str(answer.get("question") or "Code in this cell wants to reach a host")[:300]
    prompt = prompt_text(question, choices)
    for _ in range(PROMPT_ATTEMPTS):
        typed = str(person.ask(prompt)).strip().lower()
        for choice in choices:
            if typed and choice.startswith(typed):
                return str(choice)
        prompt = f"Please answer {', '.join(choices[:-1])} or {choices[-1]}. {question}. Allow? "
    return "no"
