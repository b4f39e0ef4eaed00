"""[host] The host's own questions at a client's input prompt, on the relay's stdin channel.

The host asks the person about an unknown host itself: it sends the running cell's
``input_request`` on the clients' stdin ROUTER (the relay's, outside the sandbox), to the routing
identities of the client's own ``execute_request``, parented by that request's header, and takes
the client's ``input_reply`` for itself. Code in the kernel neither sees the question nor the
answer: neither passes its sockets, and the kernel cannot reach the clients' side of the relay
(another network namespace; the runtime folder is hidden). It holds the same HMAC key (the relay
passes the kernel's own messages on unchanged, so the clients must accept its signature), but a
key only signs messages on the sockets one can reach.

Which reply is the host's: one whose parent is the host's question (JupyterLab's), or, from a
client that sends its replies without a parent (jupyter_client's ``input()``, jupyter console),
the oldest question still open to that client, the kernel's own ``input()`` requests counted in
the order the client got them: a client answers its prompts in the order it shows them.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.session import Session

DELIMITER = b"<IDS|MSG>"
KEEP_REQUESTS = 256  # execute_requests remembered (each until its reply, or the oldest go)
OPEN_PROMPTS_KEPT = 64  # open prompts remembered per client (a flood of the kernel's own is cut)
# Clients with open prompts remembered: code in the kernel can address its own input_request to any
# routing identity it makes up, so past this many the least recently prompted of those holding only
# the kernel's own prompts are forgotten (a client with a host question open never is).
OPEN_CLIENTS_KEPT = 256


@dataclass(frozen=True)
class ClientRequest:
    """An execute_request a client sent, as the relay saw it."""

    identities: tuple[bytes, ...]
    header: dict[str, Any]
    allow_stdin: bool


@dataclass
class HostQuestion:
    msg_id: str
    client: bytes  # the routing identity it went to
    execution: str
    answered: threading.Event = field(default_factory=threading.Event)
    value: str | None = None  # None: no answer (the execution ended, the relay closed)


def split(frames: list[bytes]) -> tuple[list[bytes], list[bytes]] | None:
    """(routing identities, the message's frames from its signature on), or None if it is none."""
    try:
        at = frames.index(DELIMITER)
    except ValueError:
        return None
    if len(frames) < at + 6:
        return None
    return frames[:at], frames[at + 1 :]


def header_of(message: list[bytes], n: int = 1) -> dict[str, Any]:
    """The header (``n=1``) or parent header (``n=2``) of a split message; {} if it is not JSON."""
    try:
        loaded = json.loads(message[n])
    except (ValueError, UnicodeDecodeError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


class StdinQuestions:
    """The requests clients sent, the questions the host asked, and the kernel's own open prompts.
    Every method is safe from any thread."""

    def __init__(self, key: bytes | str, signature_scheme: str) -> None:
        key = key.encode() if isinstance(key, str) else key
        self._session = Session(key=key, signature_scheme=signature_scheme, username="ivralo")
        self._lock = threading.Lock()
        self._running: OrderedDict[str, ClientRequest] = OrderedDict()
        self._questions: OrderedDict[str, HostQuestion] = OrderedDict()
        # Per client identity: the prompts it was sent and has not answered, oldest first:
        # (True, question id) for the host's, (False, msg_id) for the kernel's.
        self._open: OrderedDict[bytes, deque[tuple[bool, str]]] = OrderedDict()

    # -- what the relay sees -------------------------------------------------------------
    def client_request(self, identities: list[bytes], message: list[bytes]) -> bool:
        """A client's shell message: remember an execute_request. True if it was one."""
        header = header_of(message)
        if header.get("msg_type") != "execute_request" or not identities:
            return False
        content = header_of(message, 4)
        allow_stdin = content.get("allow_stdin") is True and content.get("silent") is not True
        with self._lock:
            self._running[str(header.get("msg_id"))] = ClientRequest(tuple(identities), header, allow_stdin)
            while len(self._running) > KEEP_REQUESTS:
                self._running.popitem(last=False)
        return True

    def kernel_reply(self, message: list[bytes]) -> None:
        """A shell message from the kernel: an execute_reply ends its execution's questions (code in
        the kernel can send one early: that only makes the answer a no)."""
        if header_of(message).get("msg_type") != "execute_reply":
            return
        execution = str(header_of(message, 2).get("msg_id"))
        with self._lock:
            self._running.pop(execution, None)
            ended = [q for q in self._questions.values() if q.execution == execution]
        for question in ended:
            self._settle(question, None)

    def kernel_prompt(self, identities: list[bytes], message: list[bytes]) -> None:
        """The kernel's own input_request (``input()``) on its way to a client."""
        header = header_of(message)
        if header.get("msg_type") != "input_request" or not identities:
            return
        with self._lock:
            self._opened(identities[0], (False, str(header.get("msg_id"))))

    def client_reply(self, identities: list[bytes], message: list[bytes]) -> bool:
        """A client's stdin message. True: it answered the host's question and is the host's (never
        passed on to the kernel); False: it goes on to the kernel."""
        header = header_of(message)
        if header.get("msg_type") != "input_reply" or not identities:
            return False
        client, parent = identities[0], str(header_of(message, 2).get("msg_id") or "")
        with self._lock:
            waiting = self._open.get(client, deque())
            if parent:
                entry = next((e for e in waiting if e[1] == parent), None)
            else:
                entry = waiting[0] if waiting else None
            if entry is None:
                return False
            mine, msg_id = entry
            question = self._questions.get(msg_id) if mine else None
            if question is None:  # the kernel's own prompt: answered now, and the answer is the kernel's
                waiting.remove(entry)
                return False
        try:  # the signature, as the kernel checks a client's: an unsigned reply answers nothing
            content = self._session.deserialize(message, content=True)["content"]
        except Exception:  # noqa: BLE001 - a reply that does not verify is dropped, never passed on
            return True
        with self._lock:
            if entry in waiting:
                waiting.remove(entry)
        if not question.answered.is_set():  # else a late answer to a question that ended: nobody's
            value = content.get("value") if isinstance(content, dict) else None
            self._settle(question, value if isinstance(value, str) else "")
        return True

    def client_session(self, execution: str) -> str | None:
        """The client session (its header's ``session``) that sent ``execution``, while it runs and
        if that client allowed stdin: who could be asked about it."""
        with self._lock:
            request = self._running.get(execution)
        if request is None or not request.allow_stdin:
            return None
        session = request.header.get("session")
        return session if isinstance(session, str) else None

    # -- the host's question ---------------------------------------------------------------
    def question(self, execution: str, prompt: str) -> tuple[HostQuestion, list[bytes]] | None:
        """The input_request to send for ``execution``, or None: no client that sent it can answer
        (not a request a client sent, it already ended, or the client did not allow stdin)."""
        with self._lock:
            request = self._running.get(execution)
            if request is None or not request.allow_stdin:
                return None
            msg_id = uuid.uuid4().hex  # the kernel never sees it: only the client can parent a reply by it
            message = self._session.msg("input_request", {"prompt": prompt, "password": False}, parent=request.header)
            message["header"]["msg_id"] = msg_id
            frames = self._session.serialize(message, ident=list(request.identities))
            question = HostQuestion(msg_id, request.identities[0], execution)
            self._questions[msg_id] = question
            while len(self._questions) > OPEN_PROMPTS_KEPT:
                self._questions.popitem(last=False)
            self._opened(question.client, (True, msg_id))
        return question, frames

    def _opened(self, client: bytes, entry: tuple[bool, str]) -> None:
        """(under the lock) A prompt the client was sent. A question that ended unanswered stays
        open: the client still shows it, and the answer typed there is still not the kernel's."""
        waiting = self._open.setdefault(client, deque())
        self._open.move_to_end(client)
        waiting.append(entry)
        while len(waiting) > OPEN_PROMPTS_KEPT:
            waiting.popleft()
        if len(self._open) > OPEN_CLIENTS_KEPT:
            # Never a client with a host question open: its answer must stay the host's.
            idle = next((c for c, w in self._open.items() if not any(mine for mine, _ in w)), None)
            if idle is not None:
                del self._open[idle]

    def unreachable(self, msg_id: str) -> None:
        """The question's client has no stdin connection: nobody can answer it."""
        with self._lock:
            question = self._questions.get(msg_id)
        if question is not None:
            self._settle(question, None)

    def end_all(self) -> None:
        with self._lock:
            questions = list(self._questions.values())
        for question in questions:
            self._settle(question, None)

    @staticmethod
    def _settle(question: HostQuestion, value: str | None) -> None:
        if not question.answered.is_set():
            question.value = value
            question.answered.set()
