"""[host] The provisioner's watchdog: per-execution deadlines and memory limits, for every client.

It runs in a **thread**, not an asyncio task: under the blocking ``KernelManager`` (jupyter
console) the host's event loop only runs inside client calls. It has its own jupyter_client
``Session`` identity and its own IOPub and control sockets, so it sees executions started by any
client (a browser tab, an agent) and never steals another client's replies.

Executions are tracked from IOPub ``status`` busy/idle whose parent is an ``execute_request``,
keyed by the parent ``msg_id``. The ivralo kernel's IOPub reports every subscriber (``XPUB_VERBOSE``),
so each subscriber, ours and each client's, gets its own ``iopub_welcome``; ours is the proof that
our subscription is live, after which we say hello to the kernel's broker. IOPub can drop messages
under an output flood, so before killing, the watchdog asks the kernel over control whether the
execution is still running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import zmq
from jupyter_client.session import Session as JupyterSession

from ivralo_kernel.host.broker import BrokerResponder
from ivralo_kernel.host.escalation import Action, DeadlinePolicy, Escalation, Phase
from ivralo_kernel.host.observer import Observer, Sample, human_bytes, sample_tree
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import BrokerAnswer, BrokerHello, BrokerReply, DeadlineNotice

CONTROL_ANSWER_S = 0.1  # how long the kernel has to act on a deadline notice itself
HELLO_RETRY_S = 0.5  # the broker hello is sent again until the kernel answers it
RECONNECT_IVL_MS = 10  # how often our sockets retry a kernel that is not bound yet
REPLY_MARGIN_S = 0.05  # how much longer its answer may take to reach us
KEEP_OUTCOMES = 64
# A settling execution's tree is quiet when it used at most this share of one core since the last
# sample (ipykernel's own bookkeeping after a cell is a few milliseconds).
QUIET_CPU_SHARE = 0.25
# Between the end of the grace and the supervisor's kill, as the kernel's own backstop has it
# (kernel/deadline.py BACKSTOP_SLACK_S: the host acts first, the supervisor catches what it missed).
BACKSTOP_SLACK_S = 0.12


@dataclass(frozen=True)
class Loss:
    """Why the watchdog ended the kernel's tree."""

    cause: str  # "timeout: ..." or "memory: ..."
    observer: str  # the observer's one-line description at the moment of the kill
    msg_id: str | None
    parent: dict[str, Any] | None = None  # the header of the execution that was running, if seen
    requester: tuple[bytes, ...] = ()  # its shell routing identity, as the kernel reported it


@dataclass(frozen=True)
class WatchdogSettings:
    deadline: DeadlinePolicy | None = None
    memory_soft_limit_bytes: int | None = None
    memory_hard_limit_bytes: int | None = None
    observer_poll_ms: int = 500
    stall_window_ms: int = 5_000


class Watchdog:
    def __init__(
        self,
        connection_info: dict[str, Any],
        root_pid: int,
        settings: WatchdogSettings,
        kill_tree: Callable[[], None],
        log: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        exit_status: Callable[[], int | None] | None = None,
        on_loss: Callable[[Loss], None] | None = None,
        broker: BrokerResponder | None = None,
        comm_id: str | None = None,
        interrupt: Callable[[], None] | None = None,
        backstop: Callable[[str, float | None], None] | None = None,
        requested: Callable[[str], bool] | None = None,
    ) -> None:
        self.settings = settings
        # The supervisor's backstop, armed and disarmed by us alone (execution, CLOCK_MONOTONIC or None).
        self._backstop = backstop
        # Did a client send this execute_request? (Seen by the relay; None: no relay, trust the kernel.)
        self._requested = requested
        self._armed: set[str] = set()
        self._settle_from: dict[str, Sample] = {}  # a settling execution's last sample of the tree
        self.root_pid = root_pid
        self._info = connection_info
        self._kill_tree = kill_tree
        self._exit_status = exit_status or (lambda: None)
        self._on_loss = on_loss
        # SIGINT for the supervisor, which passes it on to the kernel's group (inside a sandbox,
        # the supervisor is not the launched process: bwrap would die of it).
        self._signal_interrupt = interrupt or (lambda: os.killpg(root_pid, signal.SIGINT))
        self.running: OrderedDict[str, dict[str, Any]] = OrderedDict()  # msg_id -> request header
        self._requesters: dict[str, tuple[bytes, ...]] = {}
        self.broker = broker
        self.comm_id = comm_id or uuid.uuid4().hex  # the kernel got it at launch (IVRALO_BROKER_COMM)
        self.broker_ready = threading.Event()  # the kernel answered our hello: requests flow both ways
        self._next_hello = 0.0  # when to (re)send the broker hello, until the kernel answers it
        # (msg_type, content, called with the kernel's reply or None)
        self._outbox: queue.SimpleQueue[tuple[str, Mapping[str, Any], Callable[[dict[str, Any]], None] | None]] = (
            queue.SimpleQueue()
        )
        self._reply_waiters: dict[str, Callable[[dict[str, Any]], None]] = {}  # control msg_id -> callback
        # Answers come from other threads (a brokered call, a person); a byte here wakes the poll at once.
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._log = log or logging.getLogger(__name__)
        self._clock = clock
        self.observer = Observer(root_pid, settings.stall_window_ms, clock)
        self.escalations: OrderedDict[str, Escalation] = OrderedDict()
        self.loss: Loss | None = None
        self._soft_episode = False
        self._soft_notice: str | None = None
        self._pending_confirm: dict[str, str] = {}  # control msg_id -> execution msg_id
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._session = JupyterSession(
            key=connection_info["key"].encode() if isinstance(connection_info["key"], str) else connection_info["key"],
            signature_scheme=connection_info.get("signature_scheme", "hmac-sha256"),
            username="ivralo-watchdog",
        )
        self._thread = threading.Thread(target=self._run, name=f"ivralo-watchdog-{root_pid}", daemon=True)

    # -- public, called from the host's other threads ----------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; never wait for it (teardown must not block on a reader)."""
        self._stop.set()

    def phase_of(self, msg_id: str) -> Phase | None:
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation.phase if escalation else None

    def settled(self, msg_id: str) -> bool:
        """Its escalation is over (finished, interrupted and quiet, or killed), or there is none."""
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation is None or escalation.phase.final

    def interrupted(self, msg_id: str) -> bool:
        """The deadline interrupted this execution (whether or not its tree has settled yet)."""
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation is not None and escalation.interrupted

    def take_soft_notice(self) -> str | None:
        """The memory soft-limit line, once per episode (the next result carries it)."""
        with self._lock:
            notice, self._soft_notice = self._soft_notice, None
            return notice

    def pause(self, msg_id: str) -> None:
        with self._lock:
            if msg_id in self.escalations:
                self.escalations[msg_id].pause(self._clock())
                self._settle_from.pop(msg_id, None)  # the first check takes the reference sample
                self._arm(msg_id)

    def resume(self, msg_id: str) -> None:
        with self._lock:
            if msg_id in self.escalations:
                self.escalations[msg_id].resume(self._clock())
                self._arm(msg_id)

    def _arm(self, msg_id: str) -> None:
        """(holding the lock) The supervisor's kill time for ``msg_id`` follows its escalation: the
        deadline's remainder plus the grace and slack while it runs; none while paused or final."""
        escalation = self.escalations.get(msg_id)
        if self._backstop is None or escalation is None:
            return
        running = escalation.phase in (Phase.RUNNING, Phase.INTERRUPTING, Phase.CONFIRMING, Phase.SETTLING)
        if running and not escalation.paused:
            policy = escalation.policy
            left = (policy.deadline_ms + policy.interrupt_grace_ms) / 1000 - escalation.elapsed(self._clock())
            self._armed.add(msg_id)
            self._backstop(msg_id, time.monotonic() + max(0.0, left) + BACKSTOP_SLACK_S)
        elif msg_id in self._armed:
            self._armed.discard(msg_id)
            self._backstop(msg_id, None)

    def current_execution(self) -> str | None:
        """The execution running now (the latest one the kernel said it is busy with)."""
        with self._lock:
            return next(reversed(self.running), None)

    def send_control(
        self, msg_type: str, content: Mapping[str, Any], on_reply: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        """(any thread) Send a message to the kernel's control channel, from the watchdog's thread;
        ``on_reply`` gets the kernel's reply (on the watchdog's thread)."""
        self._outbox.put((msg_type, content, on_reply))
        with self._wake_lock, contextlib.suppress(OSError):  # full: it is being drained anyway
            if self._wake_w >= 0:
                os.write(self._wake_w, b"!")

    # -- the thread ------------------------------------------------------------------------
    def _url(self, channel: str) -> str:
        transport, ip = self._info.get("transport", "tcp"), self._info.get("ip", "127.0.0.1")
        port = self._info[f"{channel}_port"]
        return f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}"

    def _run(self) -> None:
        context = zmq.Context()
        # We connect before the kernel binds, and the kernel serves nobody before our hello: retry
        # every 10 ms, not libzmq's 100, so that a new kernel's first request is not held for it.
        context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        iopub = context.socket(zmq.SUB)
        # Everything, as a client does: a welcome for another topic would reach the clients too.
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.connect(self._url("iopub"))
        control = context.socket(zmq.DEALER)
        control.setsockopt(zmq.IDENTITY, self._session.bsession)
        control.connect(self._url("control"))
        poller = zmq.Poller()
        poller.register(iopub, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        poll_s = self.settings.observer_poll_ms / 1000
        next_sample = self._clock()
        try:
            while not self._stop.is_set() and self.loss is None:
                now = self._clock()
                wake = min([next_sample, now + 0.1, *self._wakeups(now)])
                events = dict(poller.poll(max(0, int((wake - now) * 1000))))
                if iopub in events:
                    self._drain(iopub, self._on_iopub)
                if control in events:
                    self._drain(control, self._on_control)
                if self._wake_r in events:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                self._say_hello(control)
                while not self._outbox.empty():
                    msg_type, content, on_reply = self._outbox.get()
                    sent = self._send(control, msg_type, content)
                    if on_reply is not None:
                        self._reply_waiters[sent] = on_reply
                now = self._clock()
                if now >= next_sample:
                    next_sample = now + poll_s
                    self._check_memory()
                    self._check_exit()
                self._advance(now, control)
        except Exception:  # noqa: BLE001 - a watchdog that dies silently is worse than a logged one
            self._log.exception("ivralo watchdog for pid %s stopped", self.root_pid)
        finally:
            iopub.close(linger=0)
            control.close(linger=0)
            context.term()
            with self._wake_lock:  # a late answer must not write to a reused descriptor number
                os.close(self._wake_r)
                os.close(self._wake_w)
                self._wake_w = -1

    def _wakeups(self, now: float) -> list[float]:
        with self._lock:
            return [w for e in self.escalations.values() if (w := e.next_wakeup(now)) is not None]

    def _say_hello(self, control: zmq.Socket[Any]) -> None:
        """Once our IOPub subscription is live (any message on it proves it: ipykernel sends an
        iopub_welcome first), tell the kernel its broker requests will be heard; again every
        ``HELLO_RETRY_S`` until it answers, on the connection its answers will come back on."""
        if self.broker is None or self.broker_ready.is_set() or not self.observer.ready:
            return
        now = self._clock()
        if now >= self._next_hello:
            self._send(control, names.MSG_BROKER_HELLO, BrokerHello(comm_id=str(self.comm_id)))
            self._next_hello = now + HELLO_RETRY_S

    def _drain(self, socket: zmq.Socket[Any], handle: Callable[[dict[str, Any]], None]) -> None:
        while True:
            try:
                _, msg = self._session.recv(socket, mode=zmq.NOBLOCK, content=True)
            except (ValueError, KeyError):  # unsigned or malformed: not from the kernel we watch
                continue
            if msg is None:
                return
            handle(msg)

    def _on_iopub(self, msg: dict[str, Any]) -> None:
        self.observer.ready = True
        if msg["header"]["msg_type"] == "comm_msg":
            self._on_broker_request(msg)
            return
        if msg["header"]["msg_type"] != "status":
            return
        parent = msg.get("parent_header") or {}
        if parent.get("msg_type") != "execute_request":
            return
        msg_id, state, now = parent.get("msg_id"), msg["content"].get("execution_state"), self._clock()
        if not msg_id:
            return
        with self._lock:
            if state == "busy":
                self.running[msg_id] = parent
                self._requesters[msg_id] = _requester(msg)
                self.observer.busy = True
                # A real next execution ends the settling ones. A "busy" for a request no client
                # sent is code in the kernel publishing it: the earlier execution is not over.
                real = self._requested is None or self._requested(msg_id)
                for earlier, escalation in self.escalations.items():
                    if real and earlier != msg_id and escalation.phase is Phase.SETTLING:
                        escalation.on_next_execution(now)
                        self._arm(earlier)
                if self.settings.deadline is not None and msg_id not in self.escalations:
                    self.escalations[msg_id] = Escalation(self.settings.deadline, started_at=now)
                    self._arm(msg_id)
                    while len(self.escalations) > KEEP_OUTCOMES:
                        self.escalations.popitem(last=False)
            elif state == "idle":
                self.running.pop(msg_id, None)
                self._requesters.pop(msg_id, None)
                self.observer.busy = False
                if msg_id in self.escalations:
                    self.escalations[msg_id].on_idle(now)
                    if self.escalations[msg_id].phase is Phase.SETTLING:
                        # The kernel's word; the tree's comes from samples from here on.
                        reference = sample_tree(self.root_pid, self._clock)
                        if reference is not None:
                            self._settle_from[msg_id] = reference

    def _on_broker_request(self, msg: dict[str, Any]) -> None:
        content = msg.get("content") or {}
        if self.broker is None or content.get("comm_id") != self.comm_id:
            return
        request = content.get("data")
        req_id = request.get("req_id") if isinstance(request, dict) else None
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        with self._lock:
            execution = parent_id if parent_id in self.running else None

        def reply(answer: BrokerAnswer) -> None:  # from this thread, an asking or a calling thread
            self.send_control(names.MSG_BROKER_REPLY, BrokerReply(req_id=str(req_id), answer=answer))

        def pause(on: bool) -> None:
            if execution is not None:
                (self.pause if on else self.resume)(execution)

        self.broker.answer(request, execution, reply, pause)

    def _on_control(self, msg: dict[str, Any]) -> None:
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        waiter = self._reply_waiters.pop(parent_id, None) if parent_id else None
        if waiter is not None:
            waiter(msg)
            return
        if msg["header"]["msg_type"] == names.MSG_BROKER_HELLO + "_reply":
            if msg["content"].get("status") == "ok":
                self.broker_ready.set()
            return
        if msg["header"]["msg_type"] != "ivralo_status_reply" or parent_id not in self._pending_confirm:
            return
        msg_id = self._pending_confirm.pop(parent_id)
        with self._lock:
            escalation = self.escalations.get(msg_id)
            action = (
                escalation.on_confirm(msg["content"].get("executing") == msg_id, self._clock())
                if escalation
                else Action.NONE
            )
            if escalation is not None and escalation.phase is Phase.SETTLING:
                reference = sample_tree(self.root_pid, self._clock)
                if reference is not None:
                    self._settle_from[msg_id] = reference
            self._arm(msg_id)
        if action is Action.KILL:
            self._kill(msg_id, self._timeout_cause())

    def _advance(self, now: float, control: zmq.Socket[Any]) -> None:
        with self._lock:
            actions = [(msg_id, e.step(now)) for msg_id, e in self.escalations.items() if not e.phase.final]
        for msg_id, action in actions:
            if action is Action.CHECK_QUIET:
                action = self._check_quiet(msg_id, now)
            if action is Action.INTERRUPT:
                self._interrupt(msg_id, control)
            elif action is Action.CONFIRM:
                self._pending_confirm[self._send(control, names.MSG_STATUS_REQUEST, {})] = msg_id
            elif action is Action.KILL:
                self._kill(msg_id, self._timeout_cause())
            with self._lock:
                self._arm(msg_id)

    def _check_quiet(self, msg_id: str, now: float) -> Action:
        """A settling or paused execution: has the tree computed since the last sample?"""
        sample = sample_tree(self.root_pid, self._clock)
        reference = self._settle_from.get(msg_id)
        quiet, span = True, 0.0  # the tree is gone: nothing computes
        if sample is not None:
            self._settle_from[msg_id] = sample
            span = sample.at - reference.at if reference is not None else 0.0
            quiet = reference is not None and sample.cpu_s - reference.cpu_s <= QUIET_CPU_SHARE * max(span, 0.01)
        with self._lock:
            escalation = self.escalations.get(msg_id)
            action = escalation.on_quiet_check(quiet, now, span) if escalation is not None else Action.NONE
            if escalation is not None and escalation.phase.final:
                self._settle_from.pop(msg_id, None)
        return action

    def _send(self, control: zmq.Socket[Any], msg_type: str, content: Mapping[str, Any]) -> str:
        sent = self._session.send(control, msg_type, dict(content))
        return str(sent["header"]["msg_id"]) if sent else ""

    def _timeout_cause(self) -> str:
        assert self.settings.deadline is not None
        return f"timeout: execution exceeded deadline_ms={self.settings.deadline.deadline_ms}"

    def _interrupt(self, msg_id: str, control: zmq.Socket[Any]) -> None:
        """Ask the kernel to interrupt its own main thread (and show the deadline message); if it
        cannot answer in time (native code holding the GIL), signal the process group instead."""
        assert self.settings.deadline is not None
        self._log.warning(
            "ivralo: execution %s exceeded deadline_ms=%s; interrupting (grace %s ms)",
            msg_id,
            self.settings.deadline.deadline_ms,
            self.settings.deadline.interrupt_grace_ms,
        )
        act_before = time.monotonic() + CONTROL_ANSWER_S  # CLOCK_MONOTONIC: the kernel compares it
        notice = DeadlineNotice(msg_id=msg_id, deadline_ms=self.settings.deadline.deadline_ms, act_before=act_before)
        sent = self._send(control, names.MSG_DEADLINE_NOTICE, notice)
        until = act_before + REPLY_MARGIN_S
        while (left := until - time.monotonic()) > 0 and control.poll(max(1, int(left * 1000))):
            _, reply = self._session.recv(control, mode=zmq.NOBLOCK, content=True)
            if reply is None:
                continue
            if (reply.get("parent_header") or {}).get("msg_id") != sent:
                self._on_control(reply)
            elif reply["content"].get("interrupted"):
                return
            else:
                break  # it answered but is no longer running that execution, or was too late
        with contextlib.suppress(ProcessLookupError):
            self._signal_interrupt()

    def _check_memory(self) -> None:
        sample = self.observer.poll()
        if sample is None:
            return
        hard, soft = self.settings.memory_hard_limit_bytes, self.settings.memory_soft_limit_bytes
        if hard is not None and sample.rss > hard:
            self._kill(None, f"memory: RSS {human_bytes(sample.rss)} exceeded memory_hard_limit_bytes={hard}")
            return
        if soft is None:
            return
        with self._lock:
            if sample.rss > soft and not self._soft_episode:
                self._soft_episode = True
                self._soft_notice = (
                    f"[ivralo memory] RSS {human_bytes(sample.rss)} exceeds the {human_bytes(soft)} soft limit — "
                    "delete objects you no longer need (del name)"
                )
                self._log.warning("ivralo: %s", self._soft_notice)
            elif sample.rss <= soft:
                self._soft_episode = False

    def _check_exit(self) -> None:
        """The supervisor's own deadline backstop ended the tree (it exits 124): that is a loss too,
        of the execution we saw running, if any."""
        if self._exit_status() == names.DEADLINE_EXIT_STATUS and self.settings.deadline is not None:
            msg_id = next(reversed(self.running), None)
            self._record_loss(msg_id, self._timeout_cause())

    def _kill(self, msg_id: str | None, cause: str) -> None:
        self._log.warning("ivralo: ending the kernel's process tree (%s; %s)", cause, self.observer.describe())
        loss = self._record_loss(msg_id, cause, announce=False)
        self._kill_tree()
        if self._on_loss is not None:
            self._on_loss(loss)

    def _record_loss(self, msg_id: str | None, cause: str, announce: bool = True) -> Loss:
        msg_id = msg_id or next(reversed(self.running), None)  # a memory kill: what was running
        key = msg_id or ""
        self.loss = Loss(cause, self.observer.describe(), msg_id, self.running.get(key), self._requesters.get(key, ()))
        if announce and self._on_loss is not None:
            self._on_loss(self.loss)
        return self.loss


def _requester(msg: dict[str, Any]) -> tuple[bytes, ...]:
    raw = (msg.get("metadata") or {}).get(names.KERNEL_INFO_SECTION, {}).get(names.META_REQUESTER, [])
    try:
        return tuple(bytes.fromhex(part) for part in raw if isinstance(part, str))
    except ValueError:
        return ()
