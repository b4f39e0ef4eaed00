"""[host] The watchdog's side of ``IvraloProvisioner`` (a mixin): the watchdog's settings, its start
on the kernel's channels, and what a loss does in a Jupyter host (``replace_killed_kernel``): the
killed cell is told why, and a fresh kernel is put on the same ports.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from jupyter_client.launcher import launch_kernel

from ivralo_kernel import compat
from ivralo_kernel.host.sandbox import limits as sandbox_limits
from ivralo_kernel.host.sandbox.egress_notes import EgressNotes
from ivralo_kernel.host.sandbox.kernel_output import relay_output
from ivralo_kernel.host.watch.announce import answer_lost_execution
from ivralo_kernel.host.watch.broker_socket import BrokerSocket
from ivralo_kernel.host.watch.escalation import DeadlinePolicy
from ivralo_kernel.host.watch.watchdog import Loss, Watchdog, WatchdogSettings
from ivralo_kernel.protocol import names

if TYPE_CHECKING:
    from ivralo_kernel.host.jupyter.kernel_resources import KernelResources


def killed_cell_text(cause: str, observer: str) -> str:
    """What the cell whose kernel the host killed shows (the README's screenshot shows it)."""
    return (
        f"ivralo ended this cell's kernel ({cause}; {observer}). All variables were lost; "
        "a fresh kernel is running now: re-run the cells you need."
    )


class KernelWatch:
    replacements = 0  # kernels replaced after a kill, over this provisioner's life
    _replacing = False

    if TYPE_CHECKING:  # IvraloProvisioner's, LocalProvisioner's and IvraloSettings' own
        resources: KernelResources
        parent: Any
        process: Any
        connection_info: Any
        log: Any
        deadline_ms: Any
        interrupt_before_kill: Any
        interrupt_grace_ms: Any
        memory_soft_limit_bytes: Any
        memory_hard_limit_bytes: Any
        observer_poll_ms: Any
        stall_window_ms: Any
        replace_killed_kernel: Any

        def kill_tree_now(self) -> None: ...

        def _interrupt_now(self) -> None: ...

        def _backstop_line(self, execution: str, kill_at: float | None) -> None: ...

    def watchdog_settings(self) -> WatchdogSettings:
        deadline = None
        if self.deadline_ms is not None:
            deadline = DeadlinePolicy(self.deadline_ms, self.interrupt_before_kill, self.interrupt_grace_ms)
        return WatchdogSettings(
            deadline=deadline,
            memory_soft_limit_bytes=self.memory_soft_limit_bytes,
            memory_hard_limit_bytes=self.memory_hard_limit_bytes,
            memory_cgroup=self.resources.launch.cgroup,
            observer_poll_ms=self.observer_poll_ms,
            stall_window_ms=self.stall_window_ms,
            exchange_dir=self.resources.exchange_dir,
            inotify_instances_max=sandbox_limits.inotify_instances_allowed(),
        )

    def _start_watchdog(self) -> None:
        process = self.process
        if process is None:
            return
        self.resources.watchdog = Watchdog(
            dict(self.connection_info),
            process.pid,
            self.watchdog_settings(),
            self.kill_tree_now,
            self.log,
            exit_status=process.poll,
            on_loss=self._after_loss,
            broker=self.resources.broker,
            comm_id=self.resources.broker_comm_id,
            broker_socket=self.resources.broker_socket,
            interrupt=self._interrupt_now,
            backstop=self._backstop_line,
            requested=self.resources.relay.requested if self.resources.relay is not None else None,
            replied=self.resources.relay.replied if self.resources.relay is not None else None,
            on_idle=self.resources.history_recorder.poke if self.resources.history_recorder is not None else None,
        )
        send = self.resources.watchdog.send_control
        gate = self.resources.egress
        if gate is not None:
            gate.notes = EgressNotes(lambda note, on_reply: send(names.MSG_EGRESS_NOTE, note, on_reply))
        self.resources.watchdog.start()

    def _new_broker_socket(self, kwargs: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
        """The replacement's own broker socket (the dead kernel may have left half a frame in its
        own): ``kwargs`` with the new end in place of the old one, which is closed already."""
        old = self.resources.broker_socket
        if old is None:
            return kwargs
        pass_fds = tuple(fd for fd in kwargs.get("pass_fds", ()) if fd != old.kernel_fd)
        old.close()
        new = self.resources.broker_socket = BrokerSocket()
        kwargs = {**kwargs, "pass_fds": new.pass_to(env, pass_fds)}
        assert self.resources.launch.launch_args is not None
        self.resources.launch.launch_args = (self.resources.launch.launch_args[0], kwargs)  # for the next one
        return kwargs

    def _after_loss(self, loss: Loss) -> None:
        """(watchdog thread) Tell the killed cell why, then put a fresh kernel on the same ports."""
        if not self.replace_killed_kernel or self.resources.launch.launch_args is None:
            return
        self._replacing = True
        try:
            text = killed_cell_text(loss.cause, loss.observer)
            if self.resources.relay is not None:
                self.resources.relay.end_questions()  # the killed kernel's questions end, as a no
            if loss.parent:
                # Through the relay, when there is one: answered where the dead kernel's sockets were.
                info = self.resources.kernel_side if self.resources.relay is not None else dict(self.connection_info)
                answer_lost_execution(dict(info or {}), loss.parent, loss.requester, text)
            cmd, kwargs = self.resources.launch.launch_args
            if self.resources.watchdog is not None:  # the dead kernel's: it writes no more kill times
                self.resources.watchdog.stop()
            # The killed kernel's socket files: the new one binds the same.
            if self.resources.launch.folder is not None and self.resources.relay is not None:
                self.resources.launch.folder.clear_kernel_sockets()
            elif self.parent is not None:
                self.parent.cleanup_ipc_files()
            if self.resources.launch.folder is not None:
                self.resources.launch.folder.rewind_seccomp()  # bwrap reads its filter again
            env = dict(kwargs.get("env") or os.environ)
            env[names.ENV_REPLACEMENT] = "1"  # it holds requests until its IOPub subscribers are back
            kwargs = self._new_broker_socket(kwargs, env)
            compat.adopt_process(self, launch_kernel(cmd, **{**kwargs, "env": env}))
            if self.resources.broker_socket is not None:
                self.resources.broker_socket.launched()
            relay_output(self.process)
            self.resources.launch.supervisor = self.resources.launch.supervisor_process = None
            self.replacements += 1
            self.log.warning("ivralo: replaced the kernel after %s (%d so far)", loss.cause, self.replacements)
            self._start_watchdog()
        finally:
            self._replacing = False
