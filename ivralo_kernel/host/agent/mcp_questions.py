"""[host] The egress question over MCP: ``Session``'s ``ask`` callback answered by the person at the
MCP client, through elicitation.

The callback runs on the host (the session's loop): the kernel never sees the question or the
answer. A cell's question is put on the desk; the tool call that is waiting for the cell takes it
and asks the client, in whichever way the client's protocol speaks (``mcp_server.py``): a request
from the server (the legacy handshake), or an input-required result answered on the client's next
call (the 2026 stateless protocol). Whatever does not come back as one of the offered choices,
within ``ANSWER_WAIT_S``, is a no.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp.server.elicitation import render_elicitation_schema
from mcp.types import ElicitResult
from pydantic import BaseModel, Field, create_model

# A person who never answers has said no; the session's deadline does not run meanwhile.
ANSWER_WAIT_S = 300.0
ANSWER_FIELD = "answer"
MEANINGS = {
    "yes": "yes: allow this host and port for this session",
    "always": "always: allow it from now on in this folder",
    "no": "no: refuse it",
}


@dataclass
class PendingQuestion:
    """One question from a running cell, and the answer the person gives."""

    question: str
    choices: tuple[str, ...]
    answer: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def schema(self) -> type[BaseModel]:
        """A form with one property, ``answer``, whose choices are the ones this folder offers."""
        choice = Literal.__getitem__(self.choices)  # a Literal of the choices known only now
        described = Field(description="; ".join(MEANINGS.get(c, c) for c in self.choices))
        model: type[BaseModel] = create_model("EgressAnswer", **{ANSWER_FIELD: (choice, described)})  # type: ignore[call-overload]
        return model

    def requested_schema(self) -> dict[str, Any]:
        return render_elicitation_schema(self.schema())

    def take(self, result: ElicitResult | Any) -> None:
        """The client's answer: one of the offered choices when accepted, else no."""
        if self.answer.done():
            return
        answer = "no"
        if isinstance(result, ElicitResult) and result.action == "accept":
            given = (result.content or {}).get(ANSWER_FIELD)
            if isinstance(given, str) and given in self.choices:
                answer = given
        self.answer.set_result(answer)

    def refuse(self) -> None:
        if not self.answer.done():
            self.answer.set_result("no")


class QuestionDesk:
    """Where a session's ``ask`` leaves a cell's question for the tool call that waits on the cell."""

    def __init__(self) -> None:
        self._waiting: list[PendingQuestion] = []
        # Resolved when a question arrives: a plain future, so that waiting on it costs a call
        # nothing (no task) when no question comes, which is nearly always.
        self._arrival: asyncio.Future[None] | None = None
        # Set by each run_python call: does this client take a form? None of it: the answer is no,
        # as a Session without ``ask`` gives.
        self.client_elicits = False

    async def ask(self, question: str, choices: tuple[str, ...]) -> str:
        """``Session``'s ``ask``: wait for the person's answer, or no."""
        if not self.client_elicits:
            return "no"
        pending = PendingQuestion(question, tuple(choices))
        self._waiting.append(pending)
        if self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)
        try:
            return await asyncio.wait_for(asyncio.shield(pending.answer), ANSWER_WAIT_S)
        except TimeoutError:
            pending.refuse()
            return "no"

    def arrival(self) -> asyncio.Future[None]:
        """A future resolved once a question waits (at once if one does)."""
        if self._arrival is None or self._arrival.done():
            self._arrival = asyncio.get_running_loop().create_future()
            if self._waiting:
                self._arrival.set_result(None)
        return self._arrival

    def take(self) -> PendingQuestion | None:
        return self._waiting.pop(0) if self._waiting else None

    def refuse_all(self) -> None:
        """Nobody will answer the questions still on the desk (the server is closing)."""
        while self._waiting:
            self._waiting.pop(0).refuse()
