"""[host] The five Jupyter channels, relayed between the clients' endpoints and a sandboxed kernel's
``ipc`` sockets in its run folder.

Two hosts use it. The raw launch's (VS Code chose TCP ports; the kernel lives in a network namespace
of its own, where a TCP port is out of its reach). And the provisioner, whose clients connect to
``ipc`` sockets outside the sandbox: there the relay also sees every request a client sends on
shell, which the kernel cannot forge (``requested``), so the host can tell a real new execution
from a "busy" that code in the kernel published itself.

Each channel has a thread of its own. Four are ``zmq.proxy_steerable`` (libzmq moves the frames);
shell is a short Python loop when its requests are watched. Routing identities survive the trip: a
client's request reaches the kernel as ``[relay identity, client identity, <IDS|MSG>, ...]``, so the
reply finds its way back by the same frames. The shell and stdin relays share one identity towards
the kernel: ipykernel sends a cell's ``input_request`` to the identities of the shell message that
ran it, on the stdin socket, and the first of them must be a peer of that socket too. IOPub is
XPUB/XSUB, so a client's subscription reaches the kernel (ipykernel greets each new subscriber).

With ``watch_requests`` the relay is also where the host asks the person itself (``ask``): stdin is
a Python loop too, which sends the host's ``input_request`` to the client and keeps the client's
answer from the kernel (``stdin_questions``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from typing import Any

import zmq

from ivralo_kernel.host.sandbox.stdin_questions import StdinQuestions, split
from ivralo_kernel.protocol.processes import channel_url

# Towards the kernel, shell and stdin are one peer (see above).
SHELL_AND_STDIN_IDENTITY = b"ivralo-relay"
# After a restart the kernel binds its ipc sockets again: reconnect to them soon.
RECONNECT_IVL_MS = 10
# At the start the relay connects to each channel only once the kernel has bound it (its file
# exists), checked this often. libzmq's own retry of a missing ipc file costs a socket, a failed connect and
# a timer in its I/O thread per channel per retry: with 16 kernels starting at once on 2 cores, those
# 8,000 retries a second were the largest part of the host's CPU and made them 1.3x slower to all
# be ready than plain ipykernel. One stat of a path per relay per tick is all this costs.
BIND_CHECK_S = 0.01
DELIMITER = b"<IDS|MSG>"
# As ipykernel does on its own ROUTERs: a peer that connects with a routing identity already in use
# takes it over. Without it libzmq keeps the first peer and ignores the newcomer's messages, and a
# client's identity is its session id: JupyterLab reconnects to a Kernel Gateway with the same
# session id while lab's gateway client leaves its first, failed attempt's socket open on the
# gateway, so the live connection's requests were never read (status "Unknown" in the browser).
HANDOVER_CHANNELS = ("shell", "stdin", "control")
KEEP_REQUESTS = 256  # execute_request ids remembered (an execution's busy follows its request at once)
EXECUTE_REPLY = b'"execute_reply"'  # cheap test before a reply's header is parsed


class ChannelRelay:
    """Binds the clients' side now (a client may connect before the kernel is up: its messages wait
    in the relay) and connects to the kernel's side, which appears when the kernel binds (again
    after a restart). ``watch_requests``: note the ids of the execute_requests clients send."""

    def __init__(self, client_side: dict[str, Any], kernel_side: dict[str, Any], watch_requests: bool = False) -> None:
        self._context = zmq.Context()
        self._context.setsockopt(zmq.LINGER, 0)
        self._watch = watch_requests
        # The clients' key signs the host's own questions (see stdin_questions: why the kernel's copy
        # of it does not matter).
        key, scheme = client_side.get("key", b""), str(client_side.get("signature_scheme") or "hmac-sha256")
        self._questions = StdinQuestions(key, scheme) if watch_requests else None
        self._asks_lock = threading.Lock()
        self._asks_out: zmq.Socket[Any] | None = None  # the askers' end; the stdin thread reads the other
        self._asks_in: zmq.Socket[Any] | None = None
        # execute_request id -> when a client sent it; execute_reply parent -> when it reached a client
        self._requests: OrderedDict[str, float] = OrderedDict()
        self._replies: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._controls: list[zmq.Socket[Any]] = []
        self._pairs: list[tuple[str, zmq.Socket[Any], zmq.Socket[Any]]] = []
        for channel, outer_type, inner_type in (
            ("shell", zmq.ROUTER, zmq.DEALER),
            ("stdin", zmq.ROUTER, zmq.DEALER),
            ("control", zmq.ROUTER, zmq.DEALER),
            ("hb", zmq.ROUTER, zmq.DEALER),
            ("iopub", zmq.XPUB, zmq.XSUB),
        ):
            outer = self._context.socket(outer_type)
            inner = self._context.socket(inner_type)
            if channel in ("shell", "stdin"):
                inner.setsockopt(zmq.IDENTITY, SHELL_AND_STDIN_IDENTITY)
            if channel in HANDOVER_CHANNELS:
                outer.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if channel == "stdin" and watch_requests:
                outer.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a question no client is there for fails at once
            if channel == "iopub":
                outer.setsockopt(zmq.XPUB_VERBOSE, 1)  # every client's subscription, not only the first
            inner.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            outer.bind(channel_url(client_side, channel))
            self._pairs.append((channel, outer, inner))
        self._kernel_side = kernel_side
        self._closing = threading.Event()
        self._steers: list[zmq.Socket[Any]] = []
        self._connector: threading.Thread | None = None
        self._started: set[int] = set()

    @property
    def kernel_side(self) -> dict[str, Any]:
        return self._kernel_side

    def start(self) -> None:
        """Relay from the moment the kernel has bound its sockets (at once if it has: an adopted
        spare, a restart's new relay). Clients' messages wait in the relay until then."""
        for n in range(len(self._pairs)):
            address = f"inproc://ivralo-relay-{id(self)}-{n}"
            command = self._context.socket(zmq.PAIR)
            command.bind(address)
            self._controls.append(command)
            steer = self._context.socket(zmq.PAIR)
            steer.connect(address)
            self._steers.append(steer)
        if self._questions is not None:
            address = f"inproc://ivralo-relay-{id(self)}-asks"
            self._asks_in = self._context.socket(zmq.PULL)
            self._asks_in.bind(address)
            self._asks_out = self._context.socket(zmq.PUSH)
            self._asks_out.connect(address)
        self._connector = threading.Thread(target=self._connect_when_bound, name="ivralo-relay-connect", daemon=True)
        self._connector.start()

    def _connect_when_bound(self) -> None:
        """Each channel, once the kernel has bound it: connect, and start the thread that relays it."""
        waiting = list(range(len(self._pairs)))
        while waiting:
            with self._lock:  # close() decides under it which sockets the channels' threads own
                if self._closing.is_set():
                    return
                for n in [n for n in waiting if _bound(self._kernel_urls()[n])]:
                    self._start_channel(n)
                    waiting.remove(n)
            if waiting and self._closing.wait(BIND_CHECK_S):
                return

    def _start_channel(self, n: int) -> None:
        channel, outer, inner = self._pairs[n]
        inner.connect(self._kernel_urls()[n])
        run = _proxy
        if self._watch and channel == "shell":
            run = self._shell
        elif self._watch and channel == "stdin":
            run = self._stdin
        thread = threading.Thread(target=run, args=(outer, inner, self._steers[n]), name=f"ivralo-relay-{channel}")
        thread.daemon = True
        thread.start()
        self._threads.append(thread)
        self._started.add(n)

    def _kernel_urls(self) -> list[str]:
        return [channel_url(self._kernel_side, channel) for channel, _, _ in self._pairs]

    def requested(self, msg_id: str) -> bool:
        """(any thread) Did a client send this execute_request? (Only with ``watch_requests``.)"""
        with self._lock:
            return msg_id in self._requests

    def replied(self, msg_id: str) -> bool:
        """(any thread) Did the kernel's execute_reply to it go to the client? (``watch_requests``.)"""
        with self._lock:
            return msg_id in self._replies

    def turn(self, since: float) -> tuple[str, float] | None:
        """(any thread) The execute_request the kernel must be running now, by what clients sent and
        were answered (not by what the kernel says): the first one sent at ``since`` or later that has
        no reply yet, and when its turn came (its request, or the reply to the one before it)."""
        with self._lock:
            came = since
            for msg_id, sent in self._requests.items():
                if sent < since:
                    continue
                answered = self._replies.get(msg_id)
                if answered is None:
                    return msg_id, max(sent, came)
                came = max(came, answered)
        return None

    @property
    def closed(self) -> bool:
        """(any thread) Closing or closed: its questions are nobody's to answer now."""
        return self._closing.is_set()

    def client_session(self, execution: str) -> str | None:
        """(any thread) The session of the client that sent the running ``execution``, if it allowed stdin."""
        return self._questions.client_session(execution) if self._questions is not None else None

    def ask(self, execution: str, prompt: str, timeout: float) -> str | None:
        """(any thread; blocks) Ask the person at the input prompt of ``execution``, the running
        request a client sent, and return what they typed; None: nobody can answer there (no such
        request, it ended, its client did not allow stdin) or nobody did in time. The kernel sees
        neither the question nor the answer."""
        if self._questions is None or self._asks_out is None or self._closing.is_set():
            return None
        asked = self._questions.question(execution, prompt)
        if asked is None:
            return None
        question, frames = asked
        with self._asks_lock:
            if self._closing.is_set():
                return None
            self._asks_out.send_multipart([question.msg_id.encode(), *frames])
        question.answered.wait(timeout)
        return question.value

    def end_questions(self) -> None:
        """The kernel is being replaced: its executions' questions are nobody's to answer now."""
        if self._questions is not None:
            self._questions.end_all()

    def close(self) -> None:
        """Stop every channel's thread, then the sockets (each closed by its own thread, or here if
        the kernel never bound and no thread took them)."""
        with self._lock:
            self._closing.set()
            started = set(self._started)
        if self._questions is not None:
            self._questions.end_all()
        if self._connector is not None:
            self._connector.join(timeout=5)
        for n, (_, outer, inner) in enumerate(self._pairs):
            if n not in started:
                outer.close(linger=0)
                inner.close(linger=0)
                if n < len(self._steers):
                    self._steers[n].close(linger=0)
        for n, command in enumerate(self._controls):
            if n in started:  # an unstarted channel's steer is closed: a PAIR send would block
                with contextlib.suppress(zmq.ZMQError):
                    command.send(b"TERMINATE")
        for thread in self._threads:
            thread.join(timeout=5)
        for command in self._controls:
            command.close(linger=0)
        with self._asks_lock:
            for socket in (self._asks_in, self._asks_out):
                if socket is not None and not socket.closed:
                    socket.close(linger=0)
        self._context.term()

    def _shell(self, outer: zmq.Socket[Any], inner: zmq.Socket[Any], steer: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        for socket in (outer, inner, steer):
            poller.register(socket, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if steer in events:
                    return
                if outer in events:
                    frames = outer.recv_multipart()
                    self._note(frames)
                    inner.send_multipart(frames)
                if inner in events:
                    frames = inner.recv_multipart()
                    self._note_reply(frames)
                    self._seen_from_kernel(frames)
                    outer.send_multipart(frames)
        except zmq.ZMQError:
            return
        finally:
            for socket in (outer, inner, steer):
                socket.close(linger=0)

    def _stdin(self, outer: zmq.Socket[Any], inner: zmq.Socket[Any], steer: zmq.Socket[Any]) -> None:
        """Stdin, watched: the host's questions go out to the clients; an answer to one stays here."""
        questions, asks = self._questions, self._asks_in
        assert questions is not None and asks is not None
        poller = zmq.Poller()
        for socket in (outer, inner, steer, asks):
            poller.register(socket, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if steer in events:
                    return
                if asks in events:
                    msg_id, *frames = asks.recv_multipart()
                    if not _routed(outer, frames):
                        questions.unreachable(msg_id.decode())
                if outer in events:
                    frames = outer.recv_multipart()
                    parts = split(frames)
                    if parts is None or not questions.client_reply(*parts):
                        inner.send_multipart(frames)
                if inner in events:
                    frames = inner.recv_multipart()
                    parts = split(frames)
                    if parts is not None:
                        questions.kernel_prompt(*parts)
                    _routed(outer, frames)  # to a client that is gone: dropped, as without the watch
        except zmq.ZMQError:
            return
        finally:
            for socket in (outer, inner, steer):
                socket.close(linger=0)

    def _seen_from_kernel(self, frames: list[bytes]) -> None:
        parts = split(frames) if self._questions is not None else None
        if parts is not None and self._questions is not None:
            self._questions.kernel_reply(parts[1])

    def _note(self, frames: list[bytes]) -> None:
        """A client's message: remember the id of an execute_request (its header, after the
        delimiter and the signature; the kernel checks the signature, so a bad one runs nothing)."""
        try:
            at = frames.index(DELIMITER)
            header = json.loads(frames[at + 2])
        except (ValueError, IndexError):
            return
        if isinstance(header, dict) and header.get("msg_type") == "execute_request":
            parts = split(frames)
            if self._questions is not None and parts is not None:
                self._questions.client_request(*parts)
            with self._lock:
                self._requests[str(header.get("msg_id"))] = time.monotonic()
                while len(self._requests) > KEEP_REQUESTS:
                    self._requests.popitem(last=False)

    def _note_reply(self, frames: list[bytes]) -> None:
        """The kernel's message to a client: remember which execution an execute_reply answers."""
        try:
            at = frames.index(DELIMITER)
            if EXECUTE_REPLY not in frames[at + 2]:
                return
            header, parent = json.loads(frames[at + 2]), json.loads(frames[at + 3])
        except (ValueError, IndexError):
            return
        if isinstance(header, dict) and header.get("msg_type") == "execute_reply" and isinstance(parent, dict):
            with self._lock:
                self._replies[str(parent.get("msg_id"))] = time.monotonic()
                while len(self._replies) > KEEP_REQUESTS:
                    self._replies.popitem(last=False)


def _routed(router: zmq.Socket[Any], frames: list[bytes]) -> bool:
    """Send on a ROUTER_MANDATORY socket; False if no peer has the frames' routing identity, or its
    queue is full (a client that reads no stdin: never block the relay's thread on it)."""
    try:
        router.send_multipart(frames, flags=zmq.NOBLOCK)
    except zmq.ZMQError as exc:
        if exc.errno not in (zmq.EHOSTUNREACH, zmq.EAGAIN):
            raise
        return False
    return True


def _bound(url: str) -> bool:
    """Whether the kernel has bound this address (an ipc socket's file exists, an abstract one is
    listed by the OS; tcp: assume so)."""
    if not url.startswith("ipc://"):
        return True
    path = url.removeprefix("ipc://")
    if path.startswith("@"):
        return path in _abstract_sockets()
    return os.path.exists(path)


def _abstract_sockets() -> set[str]:
    """The abstract unix sockets listening on this machine (their names, ``@`` first)."""
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            rows = (line.split() for line in table)
            return {row[7] for row in rows if len(row) > 7 and row[7].startswith("@")}
    except OSError:
        return set()


def _proxy(outer: zmq.Socket[Any], inner: zmq.Socket[Any], steer: zmq.Socket[Any]) -> None:
    with contextlib.suppress(zmq.ZMQError):
        zmq.proxy_steerable(outer, inner, None, steer)
    for socket in (outer, inner, steer):
        socket.close(linger=0)
