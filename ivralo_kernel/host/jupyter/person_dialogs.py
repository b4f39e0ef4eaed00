"""[host] The host's egress question as a dialog in the person's page (the JupyterLab extension),
instead of the cell's input prompt.

A page with the extension says which of its kernel connections answers by dialog (its client
session id, the ``session`` of the execute_requests it sends); the extension's server side
(host/jupyter/lab_server.py) records it here. When the host asks about an execution that such a
client sent, the question waits here instead of going out as an ``input_request``: the page lists
the kernel's open questions and answers one through the server, so neither the question nor the
answer passes through the kernel (code in it cannot reach the server's endpoints: it has no
network of its own, and no token). A client that never said so (``jupyter console``, another
frontend) keeps the input prompt.

The registry is keyed by kernel id, not held by a provisioner: jupyter_server makes a new
provisioner at each restart of a kernel, whose id and page stay.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

KERNELS_KEPT = 256  # kernels whose dialog clients are remembered (the least recently registered go)
CLIENTS_KEPT = 16  # per kernel: a page's reloads each make a new connection
QUESTIONS_KEPT = 64  # per kernel: open questions (the host asks one per host at a time)
ENDED_POLL_S = 0.25  # how often a waiting question checks whether its execution ended


@dataclass
class DialogQuestion:
    id: str
    execution: str
    question: str  # the sentence: what the code wants to reach, what the name means, the port
    choices: tuple[str, ...]
    answered: threading.Event = field(default_factory=threading.Event)
    value: str | None = None


class PersonDialogs:
    """Every method is safe from any thread (the egress desk asks from its own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, OrderedDict[str, None]] = OrderedDict()
        self._questions: dict[str, OrderedDict[str, DialogQuestion]] = {}

    def register(self, kernel_id: str, client: str) -> None:
        """The page's connection ``client`` to ``kernel_id`` shows the host's questions as dialogs."""
        with self._lock:
            clients = self._clients.setdefault(kernel_id, OrderedDict())
            self._clients.move_to_end(kernel_id)
            clients[client] = None
            clients.move_to_end(client)
            while len(clients) > CLIENTS_KEPT:
                clients.popitem(last=False)
            while len(self._clients) > KERNELS_KEPT:
                gone, _ = self._clients.popitem(last=False)
                self._questions.pop(gone, None)

    def by_dialog(self, kernel_id: str | None, client: str | None) -> bool:
        with self._lock:
            return kernel_id is not None and client is not None and client in self._clients.get(kernel_id, ())

    def ask(
        self,
        kernel_id: str,
        execution: str,
        question: str,
        choices: tuple[str, ...],
        timeout: float,
        ended: Callable[[], bool],
    ) -> str | None:
        """(blocks) The person's choice, or None: the execution ended first, or nobody answered in time."""
        asked = DialogQuestion(uuid.uuid4().hex, execution, question, choices)
        with self._lock:
            questions = self._questions.setdefault(kernel_id, OrderedDict())
            questions[asked.id] = asked
            while len(questions) > QUESTIONS_KEPT:
                questions.popitem(last=False)[1].answered.set()  # the oldest: no answer
        try:
            waited = 0.0
            while not asked.answered.wait(ENDED_POLL_S):
                waited += ENDED_POLL_S
                if waited >= timeout or ended():
                    return None
            return asked.value
        finally:
            with self._lock:
                self._questions.get(kernel_id, OrderedDict()).pop(asked.id, None)

    def open_questions(self, kernel_id: str) -> list[dict[str, object]]:
        with self._lock:
            kept = self._questions.get(kernel_id)
            questions = list(kept.values()) if kept is not None else []
        return [{"id": q.id, "question": q.question, "choices": list(q.choices)} for q in questions]

    def answer(self, kernel_id: str, question_id: str, choice: str) -> bool:
        """The page's answer. False: no such open question, or a choice it did not offer."""
        with self._lock:
            kept = self._questions.get(kernel_id)
            asked = kept.get(question_id) if kept is not None else None
            if asked is None or choice not in asked.choices or asked.answered.is_set():
                return False
            asked.value = choice
            asked.answered.set()
        return True


DIALOGS = PersonDialogs()  # the server process's one registry: the server extension and the provisioners share it
