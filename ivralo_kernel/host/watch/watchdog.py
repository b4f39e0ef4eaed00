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

It also decides how each execution a host caller waits for ends (``outcomes``, host/watch/outcome.py): a
loss (its kill, the tree's exit, its own end) resolves every open one, at once; the caller's reply
to an interrupted execution is held until the tree has settled. The tree's exit wakes the thread
through a pidfd, so a crash is seen when it happens, not at the next sample.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ivralo_kernel.host.watch.broker_link import BrokerLink
from ivralo_kernel.host.watch.deadline import DeadlineWatch
from ivralo_kernel.host.watch.escalation import DeadlinePolicy, Escalation, Phase
from ivralo_kernel.host.watch.kernel_channels import KernelChannels
from ivralo_kernel.host.watch.memory import MemoryWatch
from ivralo_kernel.host.watch.observer import Observer
from ivralo_kernel.host.watch.outcome import Outcome, Outcomes
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.iopub_topics import watchdog_topics

if TYPE_CHECKING:  # the broker (sqlalchemy) is loaded by the host that has one, not by a raw launch
    from ivralo_kernel.host.broker.responder import BrokerResponder
    from ivralo_kernel.host.sandbox.memory_cgroup import KernelCgroup
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket


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
    exchange_dir: str | None = None  # the data plane's folder on the host's /dev/shm: its files count
    # The tree's inotify instances above this end it: the fallback's guard (in the sandbox, its user
    # namespace's own limit refuses them first; see host/sandbox/limits.py). None: not counted.
    inotify_instances_max: int | None = None
    # The kernel's memory cgroup, whose OOM kills are a memory loss (host/sandbox/memory_cgroup.py). None: none.
    memory_cgroup: KernelCgroup | None = None


class Watchdog:
    """The thread that watches one kernel: it reads the kernel's channels (``KernelChannels``),
    follows its executions, and hands each event to its handler: deadlines (``DeadlineWatch``),
    memory (``MemoryWatch``) and the broker (``BrokerLink``). A kill ends the loop with a ``Loss``."""

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
        broker_socket: BrokerSocket | None = None,
        interrupt: Callable[[], None] | None = None,
        backstop: Callable[[str, float | None], None] | None = None,
        requested: Callable[[str], bool] | None = None,
        replied: Callable[[str], bool] | None = None,
        turn: Callable[[float], tuple[str, float] | None] | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.root_pid = root_pid
        self._log = log or logging.getLogger(__name__)
        self._clock = clock
        self._kill_tree = kill_tree
        self._exit_status = exit_status or (lambda: None)
        self._on_loss = on_loss
        # Did a client send this execute_request? (Seen by the relay; None: no relay, trust the kernel.)
        self._requested = requested
        # Which client request holds the kernel now, by the relay's count of requests and replies
        # (None: "busy" alone starts a deadline). Only requests from this watchdog's start on.
        self._turn = turn
        self._started = clock()
        self._on_idle = on_idle  # an execution ended (the history recorder's cue)
        self.observer = Observer(root_pid, settings.stall_window_ms, clock, exchange_dir=settings.exchange_dir)
        self.running: OrderedDict[str, dict[str, Any]] = OrderedDict()  # msg_id -> request header
        self._requesters: dict[str, tuple[bytes, ...]] = {}
        self._lock = threading.Lock()
        # SIGINT for the supervisor, which passes it on to the kernel's group (inside a sandbox,
        # the supervisor is not the launched process: bwrap would die of it).
        signal_interrupt = interrupt or (lambda: os.killpg(root_pid, signal.SIGINT))
        # One pipe carries the kill times of every kernel of a launch (restarts, replacements), and this
        # thread writes its executions' on each step: once stopped it must write none, or a line for the
        # crashed kernel's cell lands after the next supervisor emptied the pipe, and ends that
        # kernel's cell at the dead one's kill time (the soak: 4 in 82 cells after a restarter's restart).
        self._life = threading.Lock()
        watched_backstop = self._while_watching(backstop) if backstop is not None else None
        self.deadlines = (
            DeadlineWatch(
                settings.deadline, root_pid, clock, self._kill, signal_interrupt, watched_backstop, self._log, replied
            )
            if settings.deadline is not None
            else None
        )
        self.memory = MemoryWatch(settings.memory_soft_limit_bytes, settings.memory_hard_limit_bytes, self._log)
        # The cgroup outlives a replaced kernel: only OOM kills from this kernel's start on are its own.
        self._oom_kills_before = settings.memory_cgroup.oom_kills() if settings.memory_cgroup is not None else 0
        self.broker = (
            BrokerLink(broker, comm_id, broker_socket, clock)
            if broker is not None and broker_socket is not None
            else None
        )
        # The watchdog acts on executions' status alone: libzmq sends it only that topic, and of what
        # comes under it, only status messages reach the handlers.
        key = connection_info["key"]
        topics = watchdog_topics(key.encode() if isinstance(key, str) else key)
        self.channels = KernelChannels(connection_info, frozenset({"status"}), topics)
        self.loss: Loss | None = None
        self.outcomes = Outcomes(held=self._held)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ivralo-watchdog-{root_pid}", daemon=True)

    # -- public, called from the host's other threads ----------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; never wait for it (teardown must not block on a reader). From here on
        it writes no kill time: the lock waits only for a write in progress (the pipe does not block)."""
        with self._life:
            self._stop.set()

    def _while_watching(self, backstop: Callable[[str, float | None], None]) -> Callable[[str, float | None], None]:
        def write(execution: str, kill_at: float | None) -> None:
            with self._life:
                if not self._stop.is_set():
                    backstop(execution, kill_at)

        return write

    @property
    def escalations(self) -> Mapping[str, Escalation]:
        return self.deadlines.escalations if self.deadlines is not None else {}

    def phase_of(self, msg_id: str) -> Phase | None:
        return self.deadlines.phase_of(msg_id) if self.deadlines is not None else None

    def outcome(self, msg_id: str) -> Outcome:
        """(any thread) How ``msg_id`` ends: its reply (given by the caller's reader) or the tree's loss."""
        return self.outcomes.of(msg_id)

    def _held(self, msg_id: str) -> bool:
        """A reply to ``msg_id`` waits: the deadline interrupted it and its tree has not settled yet."""
        return self.deadlines is not None and self.deadlines.interrupted(msg_id) and not self.deadlines.settled(msg_id)

    def settled(self, msg_id: str) -> bool:
        """Its escalation is over (finished, interrupted and quiet, or killed), or there is none."""
        return self.deadlines is None or self.deadlines.settled(msg_id)

    def interrupted(self, msg_id: str) -> bool:
        """The deadline interrupted this execution (whether or not its tree has settled yet)."""
        return self.deadlines is not None and self.deadlines.interrupted(msg_id)

    def take_soft_notice(self) -> str | None:
        """The memory soft-limit line, once per episode (the next result carries it)."""
        return self.memory.take_notice()

    def pause(self, msg_id: str) -> None:
        if self.deadlines is not None:
            self.deadlines.pause(msg_id)

    def resume(self, msg_id: str) -> None:
        if self.deadlines is not None:
            self.deadlines.resume(msg_id)

    def current_execution(self) -> str | None:
        """The execution running now (the latest one the kernel said it is busy with)."""
        with self._lock:
            return next(reversed(self.running), None)

    def send_control(
        self, msg_type: str, content: Mapping[str, Any], on_reply: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        """(any thread) Send a message to the kernel's control channel, from the watchdog's thread;
        ``on_reply`` gets the kernel's reply (on the watchdog's thread)."""
        self.channels.send_control(msg_type, content, on_reply)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        channels = self.channels
        poll_s = self.settings.observer_poll_ms / 1000
        next_sample = self._clock()
        exit_fd = _pidfd(self.root_pid)  # readable once the tree's root has exited
        try:
            channels.open()
            exit_seen = [False]  # the pidfd polled readable: the root has exited
            if exit_fd is not None:
                channels.on_readable(exit_fd, lambda: exit_seen.__setitem__(0, True))
            if self.broker is not None:
                channels.on_readable(self.broker.socket.fileno(), self._on_broker_socket)
            while not self._stop.is_set() and self.loss is None:
                now = self._clock()
                wakeups = self.deadlines.wakeups(now) if self.deadlines is not None else []
                if self.broker is not None and (held := self.broker.wakeup()) is not None:
                    wakeups.append(held)
                channels.wait(min([next_sample, now + 0.1, *wakeups]) - now, self._on_iopub, self._on_control)
                if channels.iopub_seen:  # an output of any kind: our subscription is in place
                    self.observer.ready = True
                now = self._clock()
                if self.broker is not None:
                    self.broker.say_hello(channels, subscribed=self.observer.ready)
                    self.broker.expire(now, self._running_execution, self._pause_deadline)
                sampled = now >= next_sample
                if sampled:
                    next_sample = now + poll_s
                    self._check_memory()
                # With a pidfd, at once when it says so (not each turn: a waitpid costs as much as the
                # rest of a turn); and at each sample, with or without one.
                if sampled or exit_seen[0]:
                    if self._check_exit() and exit_fd is not None:
                        channels.forget(exit_fd)  # it stays readable: the outcomes are lost already
                        os.close(exit_fd)
                        exit_fd = None
                if self.deadlines is not None and self.loss is None:
                    if self._turn is not None and (holding := self._turn(self._started)) is not None:
                        self.deadlines.on_turn(*holding)
                    self.deadlines.advance(now, channels, self._on_control)
                self.outcomes.settle()
        except Exception:  # noqa: BLE001 - a watchdog that dies silently is worse than a logged one
            self._log.exception("ivralo watchdog for pid %s stopped", self.root_pid)
        finally:
            channels.close()
            if exit_fd is not None:
                os.close(exit_fd)
            # Nobody watches the tree from here on: whoever waits must not wait for us.
            self.outcomes.lose_all("the kernel's watchdog stopped")

    def _on_broker_socket(self) -> None:
        assert self.broker is not None
        sock = self.broker.socket
        self.broker.on_frames(sock.read(), self._running_execution, self._pause_deadline)
        if sock.eof:  # the kernel's end closed (it exited): nothing more will come
            self.channels.forget(sock.fileno())

    def _on_iopub(self, msg: dict[str, Any]) -> None:
        self.observer.ready = True
        if msg["header"]["msg_type"] != "status":
            return
        parent = msg.get("parent_header") or {}
        if parent.get("msg_type") != "execute_request":
            return
        msg_id, state = parent.get("msg_id"), msg["content"].get("execution_state")
        if not msg_id:
            return
        if state == "busy":
            with self._lock:
                self.running[msg_id] = parent
                self._requesters[msg_id] = _requester(msg)
            self.observer.busy = True
            if self.deadlines is not None:
                # A "busy" for a request no client sent is code in the kernel publishing it.
                self.deadlines.on_busy(msg_id, real=self._requested is None or self._requested(msg_id))
            if self.broker is not None:
                self.broker.on_busy(self._running_execution, self._pause_deadline)
        elif state == "idle":
            with self._lock:
                self.running.pop(msg_id, None)
                self._requesters.pop(msg_id, None)
            self.observer.busy = False
            if self.deadlines is not None:
                self.deadlines.on_idle(msg_id)
            if self._on_idle is not None:
                self._on_idle()

    def _pause_deadline(self, msg_id: str, on: bool) -> None:
        """While somebody answers a brokered question, the deadline does not count."""
        (self.pause if on else self.resume)(msg_id)

    def _running_execution(self, parent_id: str | None) -> str | None:
        with self._lock:
            return parent_id if parent_id in self.running else None

    def _on_control(self, msg: dict[str, Any]) -> None:
        """A control message nobody waits for: a late reply (an interrupt's, a hello's); nothing to do."""

    def cgroup_cause(self) -> str | None:
        """The memory cause when the Linux kernel's OOM killer ended a process of the kernel's cgroup."""
        group = self.settings.memory_cgroup
        return group.oom_cause() if group is not None and group.oom_kills() > self._oom_kills_before else None

    def _check_memory(self) -> None:
        if (cause := self.cgroup_cause()) is not None:  # first: the cgroup may have killed a process already
            self._kill(None, cause)
            return
        sample = self.observer.poll()
        if sample is None:
            return
        cause = self.memory.check(sample)
        limit = self.settings.inotify_instances_max
        if cause is None and limit is not None and sample.inotify > limit:
            cause = (
                f"inotify: the kernel's processes held {sample.inotify} inotify instances, above its share of "
                f"the user's limit ({limit}): the host's own file watchers would fail"
            )
        if cause is not None:
            self._kill(None, cause)

    def _check_exit(self) -> bool:
        """Has the tree's root exited? Every open execution is then lost. The supervisor's own
        deadline backstop ended it (it exits 124): that is a loss too, of the execution we saw
        running, if any."""
        status = self._exit_status()
        if status is None:
            return False
        if (cause := self.cgroup_cause()) is not None:  # the cgroup's OOM killer ended the whole tree
            self._kill(None, cause)
            return True
        if status == names.DEADLINE_EXIT_STATUS and self.deadlines is not None:
            self._record_loss(self.current_execution(), self.deadlines.cause)
        self.outcomes.lose_all(f"the kernel's process tree exited ({status})")
        return True

    def _kill(self, msg_id: str | None, cause: str) -> None:
        self._log.warning("ivralo: ending the kernel's process tree (%s; %s)", cause, self.observer.describe())
        loss = self._record_loss(msg_id, cause, announce=False)
        self._kill_tree()
        self.outcomes.lose_all(cause)  # after the kill: whoever waits finds the tree gone
        if self._on_loss is not None:
            self._on_loss(loss)

    def _record_loss(self, msg_id: str | None, cause: str, announce: bool = True) -> Loss:
        with self._lock:
            msg_id = msg_id or next(reversed(self.running), None)  # a memory kill: what was running
            key = msg_id or ""
            parent, requester = self.running.get(key), self._requesters.get(key, ())
        self.loss = Loss(cause, self.observer.describe(), msg_id, parent, requester)
        if announce and self._on_loss is not None:
            self._on_loss(self.loss)
        return self.loss


def _pidfd(pid: int) -> int | None:
    """A descriptor that polls readable once ``pid`` has exited (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _requester(msg: dict[str, Any]) -> tuple[bytes, ...]:
    raw = (msg.get("metadata") or {}).get(names.KERNEL_INFO_SECTION, {}).get(names.META_REQUESTER, [])
    try:
        return tuple(bytes.fromhex(part) for part in raw if isinstance(part, str))
    except ValueError:
        return ()
