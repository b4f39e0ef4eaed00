"""[host] ``IvraloProvisioner``: the host side of every ivralo kernel that jupyter_client starts.

jupyter_server (JupyterLab), ``jupyter console``, nbclient and agents all pick it up from
``kernel.json``. It scrubs credentials from the environment before exec, writes the launch policy
to a read-only file, and ends kernels through the supervisor so that the whole tree goes:
jupyter_client's own ``kill`` SIGKILLs the process group, which kills the supervisor before it
can clean up and leaves ``setsid`` children behind.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from typing import Any

import psutil
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets.config import Config

from ivralo_kernel import compat
from ivralo_kernel.host import prewarm, sandbox_limits
from ivralo_kernel.host.announce import answer_lost_execution
from ivralo_kernel.host.broker import BrokerResponder
from ivralo_kernel.host.channel_relay import ChannelRelay
from ivralo_kernel.host.config_watch import DOTENV, WorkspaceFiles, protected_in_sandbox
from ivralo_kernel.host.dataplane import clear_exchange_folder, create_exchange_folder
from ivralo_kernel.host.egress import PERSON_ANSWER_TIMEOUT_S
from ivralo_kernel.host.egress_notes import NOTE_WAIT_S, EgressNotes
from ivralo_kernel.host.egress_proxy import EgressProxy, Verdict
from ivralo_kernel.host.escalation import DeadlinePolicy
from ivralo_kernel.host.history_ledger import HistoryRecorder
from ivralo_kernel.host.kernel_output import relay_output
from ivralo_kernel.host.kernelspec import SUPERVISOR_MODULE
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.prewarm import PER_KERNEL_ENV, SPARE_FLAG, Recipe, Spare, SpareKey, fingerprint
from ivralo_kernel.host.processes import find_in_tree, host_pid
from ivralo_kernel.host.sandbox import SandboxUnavailable, choose_bwrap, dotenv_for_kernel, prepare_workspace
from ivralo_kernel.host.sandbox_launch import SandboxFolder, SandboxStart, kernel_connection, sandboxed_command
from ivralo_kernel.host.settings import IvraloSettings, config_file_layers
from ivralo_kernel.host.watchdog import Loss, Watchdog, WatchdogSettings
from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub
from ivralo_kernel.protocol.credentials import credential_store_paths
from ivralo_kernel.protocol.pipe import KillAt
from ivralo_kernel.protocol.pipe import encode as encode_line
from ivralo_kernel.protocol.trust import is_trusted

# How long the supervisor gets to end the tree after being asked, before we SIGKILL what we see.
SUPERVISOR_KILL_BUDGET_S = 3.0
SIGNAL_KILL_NOW = signal.SIGUSR1  # the supervisor's "kill the tree now" (see supervisor.run)


def killed_cell_text(cause: str, observer: str) -> str:
    """What the cell whose kernel the host killed shows (the README's screenshot shows it)."""
    return (
        f"ivralo ended this cell's kernel ({cause}; {observer}). All variables were lost; "
        "a fresh kernel is running now: re-run the cells you need."
    )


class IvraloProvisioner(LocalProvisioner, IvraloSettings):  # type: ignore[misc,metaclass]
    """Its settings are ``IvraloSettings``' (host/settings.py): Jupyter's config path
    (``jupyter_ivralo_config``), then the host application's own config, then ``kernel.json``."""

    def __init__(self, **kwargs: Any) -> None:
        if "config" not in kwargs:
            # jupyter_server and jupyter_client hand us their own config only: ours is read here.
            config = Config()
            for layer in config_file_layers():
                config.merge(layer.config)
            parent = kwargs.get("parent")
            if parent is not None:
                config.merge(parent.config)
            kwargs["config"] = config
        super().__init__(**kwargs)
        self.check()

    policy_file: str | None = None
    broker_comm_id: str | None = None  # this kernel's broker comm (kept by a replacement kernel)
    session_grants: frozenset[str] | None = None  # an agent Session's grants replace the configured ones
    watchdog: Watchdog | None = None
    replacements = 0  # kernels replaced after a kill, over this provisioner's life
    broker: BrokerResponder | None = None
    _launch_args: tuple[list[str], dict[str, Any]] | None = None
    _replacing = False
    sandboxed = False  # the running kernel lives in a bwrap sandbox
    sandbox_reason = ""  # why not, when it does not
    bwrap_report = ""  # which bwrap builds it and why (the others passed over), for the banner
    _sandbox_failed = ""  # bwrap could not build this provisioner's sandbox: later starts fall back at once
    _fallback_launch: tuple[list[str], dict[str, str]] | None = None  # this launch without bwrap (auto)
    egress_proxy: EgressProxy | None = None
    relay: ChannelRelay | None = None  # clients' channels <-> the sandboxed kernel's ipc sockets
    _kernel_side: dict[str, Any] | None = None  # the kernel's own connection info (inside the sandbox)
    workspace_files: WorkspaceFiles | None = None  # the workspace's files as the host trusts them
    _egress_notes: EgressNotes | None = None
    _sandbox_folder: SandboxFolder | None = None
    exchange_dir: str | None = None  # the namespace API's shared-memory folder (host.dataplane)
    history_recorder: HistoryRecorder | None = None  # records the write guard's copies (host.history_ledger)
    _supervisor: int | None = None
    _supervisor_process: psutil.Process | None = None  # the same, kept to end it if bwrap dies first
    _host_pipe: tuple[int, int] | None = None  # the sandbox's supervisor sees EOF when this process is gone
    spare_key: SpareKey | None = None  # the warm-pool key of this provisioner's kernel (host.prewarm)
    is_spare = False  # this kernel waits in the pool for a notebook
    adopted_pid: int | None = None  # the spare kernel this provisioner took over, if it did
    _launched = False  # a first launch may adopt a spare; a restart launches a fresh kernel
    _adopting: Spare | None = None
    _spare_env: dict[str, str] | None = None

    def policy_for(self, cwd: str) -> KernelPolicy:
        """The launch policy the supervisor enforces, from these settings (the workspace: ``cwd`` if none)."""
        return KernelPolicy(
            workspace=os.path.realpath(self.workspace or cwd),
            role=self.role,
            audience=self.audience,
            memory_limit_bytes=self.memory_limit_bytes,
            rlimit_nofile=self.rlimit_nofile,
            deadline_ms=self.deadline_ms,
            interrupt_grace_ms=self.interrupt_grace_ms,
            host_enforces_deadline=True,  # the watchdog below; the kernel's own stays off
            trusted=is_trusted(self.workspace or cwd, os.environ),
            landlock=self.landlock,
            landlock_network=self.landlock and self.landlock_network,
            credential_stores=credential_store_paths(os.environ, self.credential_stores),
            fallback_reads=tuple(self.fallback_reads) if self.fallback_read_floor else None,
            history_cap_bytes=self.history_cap_bytes,
            history_cap_count=self.history_cap_count,
            surface=self.surface,
            code_gate=self.gate_rules(),
        )

    def watchdog_settings(self) -> WatchdogSettings:
        """What the host's watchdog enforces for this kernel: the deadline and the memory limits."""
        deadline = None
        if self.deadline_ms is not None:
            deadline = DeadlinePolicy(self.deadline_ms, self.interrupt_before_kill, self.interrupt_grace_ms)
        return WatchdogSettings(
            deadline=deadline,
            memory_soft_limit_bytes=self.memory_soft_limit_bytes,
            memory_hard_limit_bytes=self.memory_hard_limit_bytes,
            observer_poll_ms=self.observer_poll_ms,
            stall_window_ms=self.stall_window_ms,
            exchange_dir=self.exchange_dir,
            inotify_instances_max=sandbox_limits.inotify_instances_allowed(),
        )

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """jupyter_client's step before the launch: adopts a ready spare, or builds the sandboxed command
        (the policy, the sandbox, the exchange folder, the broker and the relay)."""
        spare_of = kwargs.pop(SPARE_FLAG, None)
        self.is_spare = spare_of is not None
        if not self._launched:
            self._launched = True
            self.spare_key = self._spare_key_for(kwargs) if (self.spares > 0 or self.is_spare) else None
            spare = prewarm.POOL.take(self.spare_key) if self.spare_key is not None and not self.is_spare else None
            if spare is not None:
                return await self._adopt(spare, kwargs)
        policy = self.policy_for(str(kwargs.get("cwd") or os.getcwd()))
        bwrap = self._choose_sandbox()
        if self._sandbox_folder is None:  # the fallback's too: its ipc sockets and the proxy's socket
            self._sandbox_folder = SandboxFolder.create()
        if self.exchange_dir is None:
            self.exchange_dir = create_exchange_folder()
        else:  # a restart: what the old kernel never mapped goes
            clear_exchange_folder(self.exchange_dir)
        kwargs = await super().pre_launch(**kwargs)
        original_env = dict(kwargs["env"])
        db_names, problems = database_env_names(policy.workspace, kwargs["env"])
        env, removed = scrub(kwargs["env"], db_names)
        # The workspace files the host trusts, as they were before any kernel of it could change them.
        if self.workspace_files is not None:
            self.workspace_files.end()
        self.workspace_files = WorkspaceFiles(policy.workspace)
        if self.history_recorder is None:  # before the kernel starts: what is in its history now is not its own
            self.history_recorder = HistoryRecorder(policy.workspace, self.tool_files)
        if bwrap is not None:
            prepare_workspace(policy.workspace)  # .ivralo exists before the sandbox mounts it read-only
        protected = protected_in_sandbox(policy.workspace) if bwrap is not None else frozenset()
        for line in self.workspace_files.begin(protected):
            self.log.warning("ivralo: %s", line)
            env[names.ENV_HOST_NOTES] = "\n".join(filter(None, (env.get(names.ENV_HOST_NOTES), line)))
        # The workspace's .env is read here, never by the kernel: only its plain values go in.
        env.update(dotenv_for_kernel(policy.workspace, env, self.workspace_files.usable(DOTENV)))
        for problem in problems:
            self.log.warning("ivralo: %s", problem)
        if removed:  # names only: values never reach a log
            self.log.info(
                "ivralo: kept %d credential variable(s) out of the kernel: %s", len(removed), ", ".join(removed)
            )
        self.policy_file = self._write_policy(policy)
        # A fresh responder per kernel ("yes this time" lasts one worker's life); the asker stays.
        # It holds the credentials, so it reads the environment before the scrub.
        previous = self.broker
        self.broker = BrokerResponder(
            policy.workspace,
            bool(policy.trusted),
            previous.asker if previous else None,
            grants=self.session_grants if self.session_grants is not None else self.grants,
            env=original_env,
            operations_files=(self.operations_file,) if self.operations_file else (),
            files=self.workspace_files,
        )
        self.broker.egress.person = self.ask_person
        if previous is not None:
            previous.close()
        self.broker_comm_id = uuid.uuid4().hex
        env[names.ENV_BROKER_COMM] = self.broker_comm_id
        env[names.ENV_POLICY_FILE] = self.policy_file
        env[names.ENV_WORKSPACE] = policy.workspace
        env[names.ENV_EXCHANGE_DIR] = self.exchange_dir
        kwargs["env"] = env
        kwargs["cwd"] = policy.workspace
        self._supervisor = self._supervisor_process = None
        # The host's pipe to the supervisor: EOF when this process is gone, and the deadline backstop's
        # lines, which only we can write (both ends close-on-exec; only the read end is passed on).
        if self._host_pipe is None:
            self._host_pipe = os.pipe()
            os.set_blocking(self._host_pipe[1], False)  # a wedged supervisor must not block the watchdog
        env[names.ENV_HOST_PIPE_FD] = str(self._host_pipe[0])
        kwargs["pass_fds"] = (self._host_pipe[0],)
        # The kernel's Jupyter links are ipc sockets in its run folder, relayed by the host, with or
        # without the sandbox: the person is asked on the relay, and the fallback's TCP rule cuts nothing.
        cmd, inner_file, connection_file = self._relayed(list(kwargs["cmd"]), abstract=bwrap is None)
        env[names.ENV_EGRESS_SOCKET] = self._egress_socket()
        env[names.ENV_RELAY_PORT] = str(names.RELAY_PORT_ANY)  # the fallback's: the supervisor picks one
        if bwrap is None:
            env[names.ENV_SANDBOX] = self.sandbox_reason
            kwargs["cmd"] = cmd
            return kwargs
        self._fallback_launch = (list(kwargs["cmd"]), dict(env))  # if bwrap exits without building it
        self._add_host_note(env, f"OS sandbox built with {self.bwrap_report}")
        kwargs["cmd"] = self._sandboxed(bwrap, policy.workspace, cmd, env, inner_file, connection_file)
        if self._sandbox_folder is not None:  # bwrap reads its seccomp filter from this one
            kwargs["pass_fds"] = (*kwargs["pass_fds"], *self._sandbox_folder.rewind_seccomp())
        return kwargs

    def _choose_sandbox(self) -> str | None:
        """The bwrap to build this kernel's sandbox with, or None (and why, in ``sandbox_reason``)."""
        if self.sandbox == "off":
            bwrap, why = None, "turned off by the host's settings (sandbox='off')"
        elif self._sandbox_failed:
            bwrap, why = None, self._sandbox_failed
        else:
            choice = choose_bwrap()
            bwrap, why, self.bwrap_report = choice.path, choice.why, choice.report()
        if bwrap is None and self.sandbox == "required":
            raise SandboxUnavailable(_required_but(why))
        if bwrap is None and self.sandbox == "auto" and why != self.sandbox_reason:  # once per reason
            self.log.warning("ivralo: this kernel runs without the OS sandbox: %s", why)
        self.sandboxed, self.sandbox_reason = bwrap is not None, "" if bwrap else why
        return bwrap

    @staticmethod
    def _add_host_note(env: dict[str, str], line: str) -> None:
        env[names.ENV_HOST_NOTES] = "\n".join(filter(None, (env.get(names.ENV_HOST_NOTES), line)))

    def _egress_socket(self) -> str:
        """The host's egress proxy (started once per provisioner), on a unix socket in the run folder."""
        folder = self._sandbox_folder
        assert folder is not None
        if self.egress_proxy is None:
            self.egress_proxy = EgressProxy(folder.egress_socket, self._decide_egress, self._closed_peer)
            self.egress_proxy.start()
        return folder.egress_socket

    def _relayed(self, cmd: list[str], abstract: bool) -> tuple[list[str], str, str]:
        """``cmd`` with the kernel's own connection file, and the relay between it and the clients'.
        Returns the command, the kernel's connection file and the clients'."""
        folder = self._sandbox_folder
        assert folder is not None
        # The kernel's sockets are ipc files in its run folder; the clients' (TCP as Jupyter's default, or
        # what they asked for) are the relay's, outside the sandbox. The relay also shows the host every
        # request clients send on shell, which code in the kernel cannot forge.
        connection_file = str(getattr(self.parent, "connection_file", "") or "")
        with open(connection_file, encoding="utf-8") as f:
            clients = json.load(f)
        folder.clear_kernel_sockets()  # a restart's new kernel binds the same files
        inner_file, self._kernel_side = kernel_connection(clients, folder, abstract=abstract)
        if self.relay is not None and (
            clients.get("transport") == "ipc" or self.relay.kernel_side != self._kernel_side
        ):
            # jupyter_client removes ipc files on restart: bound again, where its clients look.
            self.relay.close()
            self.relay = None
        if self.relay is None:
            self.relay = ChannelRelay(clients, self._kernel_side, watch_requests=True)
            self.relay.start()
        else:  # a restart: the old kernel's executions never reply
            self.relay.end_questions()
        return [inner_file if part == connection_file else part for part in cmd], inner_file, connection_file

    def _sandboxed(
        self, bwrap: str, workspace: str, cmd: list[str], env: dict[str, str], inner_file: str, connection_file: str
    ) -> list[str]:
        folder = self._sandbox_folder
        assert folder is not None
        return sandboxed_command(
            bwrap,
            folder,
            workspace,
            cmd,
            env,
            read_only_files=tuple(p for p in (inner_file, self.policy_file) if p),
            tool_files=tuple(self.tool_files),
            credential_stores=credential_store_paths(os.environ, self.credential_stores),
            jupyter_runtime_dir=os.path.dirname(connection_file) or None,
            exchange_dir=self.exchange_dir or "",
            memory_hard_limit_bytes=self.memory_hard_limit_bytes,
            tmpfs_size_bytes=self.tmpfs_size_bytes,
        )

    def _decide_egress(self, host: str, port: int) -> Verdict:
        """(the egress proxy's thread) The same policy and the same people as the guard's questions."""
        broker, watchdog = self.broker, self.watchdog
        if broker is None:
            return Verdict(False, "the kernel's host is shutting down")
        execution = watchdog.current_execution() if watchdog is not None else None
        if execution is None and watchdog is not None:
            # The cell's first request can be here before the watchdog has read its "busy": the kernel
            # itself knows which execution is running.
            execution = _ask_running_execution(watchdog)

        def pause(on: bool) -> None:
            if watchdog is not None and execution is not None:
                (watchdog.pause if on else watchdog.resume)(execution)

        allowed, reason = broker.egress.decide(host, port, execution, self.ask_person, pause)
        if allowed and (closed := self._closed_target(host, port)) is not None:
            allowed, reason = False, closed  # the cell's line says so; the proxy checks the address it reaches too
        if watchdog is None or execution is None:
            return Verdict(allowed, reason)
        notes = self._egress_notes
        if notes is None:
            return Verdict(allowed, reason)
        return Verdict(allowed, reason, notes.note(execution, host, port, allowed, reason))

    def _closed_target(self, host: str, port: int) -> str | None:
        """An allowed ``host:port`` that resolves to the clients' side of the relay (looked up only
        after a yes, as the proxy would)."""
        if port not in self._client_ports() | self._runtime_ports():
            return None
        try:
            addresses = {info[4] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except OSError:
            return None  # the proxy's own connect fails the same way, and says why
        return next(filter(None, map(self._closed_peer, addresses)), None)

    def _client_ports(self) -> set[int]:
        info = self.connection_info
        if info.get("transport", "tcp") != "tcp":
            return set()
        return {port for c in CHANNEL_NAMES if isinstance(port := info.get(f"{c}_port"), int)}

    def _closed_peer(self, peer: tuple[Any, ...]) -> str | None:
        """(the egress proxy's thread) The clients' side of this kernel's relay is never reachable
        through the proxy, whatever was allowed: with it, code in the kernel could take a client's
        place on stdin (its identity is in every request) and answer the host's questions. Nor are
        other kernels' channels (the Jupyter runtime folder's connection files): outside the sandbox
        a kernel can read their keys, and run code in them through the proxy after a yes."""
        if peer[1] in self._client_ports() and on_this_machine(str(peer[0])):
            return "it is one of this kernel's own Jupyter channels, for its clients only"
        if peer[1] in self._runtime_ports() and on_this_machine(str(peer[0])):
            return "it is a Jupyter kernel's channel on this machine, for that kernel's clients only"
        return None

    def _runtime_ports(self) -> set[int]:
        """The TCP ports in the connection files of Jupyter's runtime folder (every kernel's here)."""
        from jupyter_core.paths import jupyter_runtime_dir

        folders = {jupyter_runtime_dir(), os.path.dirname(str(getattr(self.parent, "connection_file", "") or ""))}
        ports: set[int] = set()
        for path in (p for folder in folders if folder for p in glob.glob(os.path.join(folder, "kernel-*.json"))):
            try:
                with open(path, encoding="utf-8") as f:
                    info = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(info, dict) and info.get("transport", "tcp") == "tcp":
                ports |= {port for c in CHANNEL_NAMES if isinstance(port := info.get(f"{c}_port"), int)}
        return ports

    def ask_person(self, execution: str, prompt: str) -> str | None:
        """(any thread; blocks) The person's answer at ``execution``'s input prompt, asked by the host
        on the clients' side of the relay, which code in the kernel can neither write nor read. No
        relay (no sandbox: the kernel binds the clients' sockets itself): nobody the host can ask."""
        relay = self.relay
        return relay.ask(execution, prompt, PERSON_ANSWER_TIMEOUT_S) if relay is not None else None

    def supervisor_pid(self) -> int | None:
        """The supervisor's pid, as the host sees it (inside a sandbox, bwrap's processes come first)."""
        process = self.process
        if process is None:
            return None
        if not self.sandboxed:
            return int(process.pid)
        if self._supervisor is None:
            self._supervisor = find_in_tree(process.pid, SUPERVISOR_MODULE)
            if self._supervisor is not None:
                with contextlib.suppress(psutil.Error):
                    self._supervisor_process = psutil.Process(self._supervisor)
        return self._supervisor

    def host_pid(self, kernel_pid: int) -> int:
        """The host's pid of the kernel that reports ``kernel_pid`` (its pid in the sandbox)."""
        if not self.sandboxed or self.process is None:
            return kernel_pid
        return host_pid(self.process.pid, kernel_pid) or kernel_pid

    def _write_policy(self, policy: KernelPolicy) -> str:
        # Beside the connection file, in the runtime dir: private to the user, cleaned with the kernel.
        runtime = os.path.dirname(str(getattr(self.parent, "connection_file", "") or "")) or None
        if runtime and not os.path.isdir(runtime):
            runtime = None
        fd, path = tempfile.mkstemp(prefix="ivralo-policy-", suffix=".json", dir=runtime)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(policy.to_json())
        os.chmod(path, stat.S_IRUSR)  # the kernel reads it; nothing should rewrite it
        return path

    def _spare_key_for(self, kwargs: dict[str, Any]) -> SpareKey | None:
        """This launch's warm-pool key: None where a spare could not stand for it (the agent API's
        managers keep their own pool; without a sandbox the kernel binds the clients' ports itself)."""
        km = self.parent
        if km is None or getattr(km, "ivralo_agent_host", False) or self.sandbox == "off":
            return None
        policy = self.policy_for(str(kwargs.get("cwd") or os.getcwd()))
        env = {k: v for k, v in dict(kwargs.get("env") or os.environ).items() if k not in PER_KERNEL_ENV}
        self._spare_env = env
        spec = self.kernel_spec.to_dict() if self.kernel_spec is not None else None
        session = getattr(km, "session", None)
        digest = fingerprint(
            self.kernel_settings(),
            policy.to_json(),
            spec,
            env,
            getattr(km, "transport", None),
            getattr(km, "ip", None),
            getattr(session, "signature_scheme", None),
            str(getattr(km, "transport_encryption", "")),
        )
        return SpareKey(policy.workspace, str(getattr(km, "kernel_name", "") or ""), digest)

    async def _adopt(self, spare: Spare, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Take a spare's kernel and every guard around it; the clients' channels are relayed to its
        sockets. The new kernel's connection file carries the spare's key (its kernel checks it)."""
        other = spare.provisioner
        if other.watchdog is not None:
            other.watchdog.stop()  # ours starts in post_launch, on the new clients' channels
            other.watchdog = None
        km = self.parent
        assert km is not None
        km.session.key = other.connection_info["key"]
        kwargs = await super().pre_launch(**kwargs)  # the connection file: the new ports, the spare's key
        for name in ADOPTED:
            setattr(self, name, getattr(other, name))
            setattr(other, name, None)
        if other.relay is not None:
            other.relay.close()  # it bound the spare manager's ports
            other.relay = None
        self.relay = ChannelRelay(dict(self.connection_info), dict(self._kernel_side or {}), watch_requests=True)
        self.relay.start()
        if self.egress_proxy is not None:
            self.egress_proxy.redirect(self._decide_egress)
            self.egress_proxy.closed_peer = self._closed_peer  # this notebook's ports now
        if self.broker is not None:
            self.broker.egress.person = self.ask_person  # asked on this provisioner's relay
        self._adopting = spare
        self.adopted_pid = int(self.process.pid) if self.process is not None else None
        self.log.info("ivralo: a warm spare kernel (pid %s) serves this notebook", self.adopted_pid)
        return kwargs

    def _want_spares(self) -> None:
        """After a notebook's kernel starts: keep ``spares`` more of its kind ready."""
        km, key = self.parent, self.spare_key
        if key is None or self.is_spare or self.spares <= 0 or not self.sandboxed or km is None:
            return
        prewarm.POOL.want(
            key,
            Recipe(
                kernel_name=key.kernel_name,
                kernel_spec_manager=getattr(km, "kernel_spec_manager", None),
                config=km.config,
                env=dict(self._spare_env or {}),
                cwd=key.workspace,
                target=self.spares,
                ttl_s=self.spare_idle_ttl_seconds,
                reserve_bytes=self.host_memory_reserve_bytes,
                log=self.log,
            ),
        )

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """Starts the kernel's tree (in the sandbox when there is one), its output on pipes; a spare's
        kernel runs already. Returns the connection info."""
        if self._adopting is not None:  # the spare's kernel runs already
            return self.connection_info
        # Pipes, never the host's own descriptors: code in the kernel could otherwise write, seek or
        # truncate the file the host logs to, or send a terminal's ioctls to the person's terminal.
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        if self._sandbox_folder is not None:
            self._sandbox_folder.rewind_seccomp()
        self._launch_args = (list(cmd), compat.popen_kwargs(kwargs))
        if not self.sandboxed:
            info = await super().launch_kernel(cmd, **kwargs)
            relay_output(self.process)
            return info
        # bwrap may exit at once (an option it lacks, a mount the OS refuses): the start waits for the
        # supervisor's first line, which only a built sandbox runs, so that is a clear failure now.
        start = SandboxStart()
        try:
            env = dict(kwargs["env"])
            pass_fds = start.pass_to(env, tuple(kwargs.get("pass_fds", ())))
            info = await super().launch_kernel(cmd, **{**kwargs, "env": env, "pass_fds": pass_fds})
            process = self.process
            assert process is not None
            failure = await off_loop(start.wait, process, cmd[0])
        finally:
            start.close()
        if failure is None:
            relay_output(self.process)
            return info
        return await self._sandbox_not_built(failure, kwargs)

    async def _sandbox_not_built(self, failure: str, kwargs: dict[str, Any]) -> Any:
        """bwrap exited without building the sandbox: with ``required``, the start fails now, saying
        why; with ``auto``, the kernel starts at once without it (and so does every restart), the
        banner saying why."""
        self.log.warning("ivralo: %s", failure)
        self.sandboxed = False
        _discard(self.process)
        if self.sandbox == "required" or self._fallback_launch is None:
            await self.cleanup(restart=False)
            self.process = None  # nothing runs: jupyter_client sees no kernel
            raise SandboxUnavailable(_required_but(failure))
        # The relay and the egress proxy stay: the fallback's kernel uses them as the sandbox's would,
        # on abstract sockets (the relay is rebuilt for them).
        self._sandbox_failed = self.sandbox_reason = failure
        cmd, env = self._fallback_launch
        cmd = self._relayed(cmd, abstract=True)[0]
        env = {**env, names.ENV_SANDBOX: self.sandbox_reason}
        kwargs = {**kwargs, "env": env}
        self._launch_args = (list(cmd), compat.popen_kwargs(kwargs))
        info = await super().launch_kernel(cmd, **kwargs)
        relay_output(self.process)
        return info

    async def post_launch(self, **kwargs: Any) -> None:
        """After the launch: starts the watchdog, lets go of an adopted spare's files, tops up the spares."""
        await super().post_launch(**kwargs)
        self._start_watchdog()
        if self._adopting is not None:
            prewarm.POOL.discard(self._adopting)  # its manager's files (connection file, control socket)
            self._adopting = None
        self._want_spares()

    def _start_watchdog(self) -> None:
        process = self.process
        if process is None:
            return
        self.watchdog = Watchdog(
            dict(self.connection_info),
            process.pid,
            self.watchdog_settings(),
            self.kill_tree_now,
            self.log,
            exit_status=process.poll,
            on_loss=self._after_loss,
            broker=self.broker,
            comm_id=self.broker_comm_id,
            interrupt=self._interrupt_now,
            backstop=self._backstop_line,
            requested=self.relay.requested if self.relay is not None else None,
            replied=self.relay.replied if self.relay is not None else None,
            on_idle=self.history_recorder.poke if self.history_recorder is not None else None,
        )
        send = self.watchdog.send_control
        self._egress_notes = EgressNotes(lambda note, on_reply: send(names.MSG_EGRESS_NOTE, note, on_reply))
        self.watchdog.start()

    def _backstop_line(self, execution: str, kill_at: float | None) -> None:
        """(watchdog thread) Arm or disarm the supervisor's backstop for one execution."""
        pipe = self._host_pipe
        if pipe is None:
            return
        with contextlib.suppress(OSError):  # full (a wedged supervisor) or closed: the watchdog still acts
            os.write(pipe[1], encode_line(KillAt(execution, kill_at)))

    def _interrupt_now(self) -> None:
        """(watchdog thread) SIGINT to the supervisor, which passes it on to the kernel's group."""
        process = self.process
        if process is None:
            return
        if self.sandboxed:
            supervisor = self.supervisor_pid()
            if supervisor is not None:
                os.kill(supervisor, signal.SIGINT)
            return
        os.killpg(process.pid, signal.SIGINT)

    async def poll(self) -> int | None:
        """The kernel's exit code, or None while it runs (or is being replaced after a kill)."""
        if self._replacing:  # between the kill and the relaunch the kernel is not dead, it is being replaced
            return None
        return await super().poll()

    def _after_loss(self, loss: Loss) -> None:
        """(watchdog thread) Tell the killed cell why, then put a fresh kernel on the same ports."""
        if not self.replace_killed_kernel or self._launch_args is None:
            return
        self._replacing = True
        try:
            text = killed_cell_text(loss.cause, loss.observer)
            if self.relay is not None:
                self.relay.end_questions()  # the killed kernel's questions end, as a no
            if loss.parent:
                # Through the relay, when there is one: answered where the dead kernel's sockets were.
                info = self._kernel_side if self.relay is not None else dict(self.connection_info)
                answer_lost_execution(dict(info or {}), loss.parent, loss.requester, text)
            cmd, kwargs = self._launch_args
            # The killed kernel's socket files: the new one binds the same.
            if self._sandbox_folder is not None and self.relay is not None:
                self._sandbox_folder.clear_kernel_sockets()
            elif self.parent is not None:
                self.parent.cleanup_ipc_files()
            if self._sandbox_folder is not None:
                self._sandbox_folder.rewind_seccomp()  # bwrap reads its filter again
            env = dict(kwargs.get("env") or os.environ)
            env[names.ENV_REPLACEMENT] = "1"  # it holds requests until its IOPub subscribers are back
            compat.adopt_process(self, launch_kernel(cmd, **{**kwargs, "env": env}))
            relay_output(self.process)
            self._supervisor = self._supervisor_process = None
            self.replacements += 1
            self.log.warning("ivralo: replaced the kernel after %s (%d so far)", loss.cause, self.replacements)
            self._start_watchdog()
        finally:
            self._replacing = False

    def kill_tree_now(self) -> None:
        """End the kernel's whole tree, from any thread: ask the supervisor, then SIGKILL what is left.

        jupyter_client's own kill SIGKILLs the process group, which kills the supervisor before it
        can clean up and leaves ``setsid`` children behind.
        """
        process = self.process
        if process is None:
            return
        if process.poll() is not None:
            # bwrap is gone; a supervisor we saw may not be (bwrap killed from outside): out of our
            # tree now, it still holds the sandbox. psutil checks it is the same process.
            orphan = self._supervisor_process
            if orphan is not None:
                with contextlib.suppress(psutil.Error):
                    for proc in [*orphan.children(recursive=True), orphan]:
                        proc.kill()
            return
        tree = self._tree_snapshot()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.supervisor_pid() or process.pid, SIGNAL_KILL_NOW)
        deadline = time.monotonic() + SUPERVISOR_KILL_BUDGET_S
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        for proc in [*self._tree_snapshot(), *tree]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()

    async def kill(self, restart: bool = False) -> None:
        """Ends the kernel's whole tree now (no grace)."""
        try:
            await off_loop(self.kill_tree_now)
        except RuntimeError:  # "cannot schedule new futures after interpreter shutdown": an atexit hook
            self.kill_tree_now()

    async def terminate(self, restart: bool = False) -> None:
        """Graceful stop: SIGTERM to the supervisor, which forwards it and then ends the tree."""
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.supervisor_pid() or self.process.pid, signal.SIGTERM)

    async def send_signal(self, signum: int) -> None:
        """Sends ``signum`` to the kernel: SIGKILL ends the tree; in the sandbox, others go to the
        supervisor, never to bwrap's group."""
        if signum == signal.SIGKILL:
            await self.kill()
            return
        if self.sandboxed:
            # Never bwrap's group: bwrap dies of a SIGINT and leaves its sandbox behind, an orphan out of
            # our tree that holds the kernel's output pipes. Before the supervisor runs (jupyter_client
            # interrupts as the first step of every shutdown, often just after the start) no code of
            # the person's runs either: nothing to signal.
            supervisor = self.supervisor_pid()
            if supervisor is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(supervisor, signum)
            return
        await super().send_signal(signum)

    async def wait(self) -> int | None:
        """LocalProvisioner.wait, without closing the kernel's stdout and stderr pipes: the output relay's
        threads own them and close them at EOF. Closing a pipe a thread is reading waits for that read,
        i.e. for every process holding the write end to end, and a shutdown must not hang on that."""
        process = self.process
        if process is not None:
            process.stdout = process.stderr = None
        return await super().wait()

    def _tree_snapshot(self) -> list[psutil.Process]:
        if not self.process:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [*root.children(recursive=True), root]
        except psutil.Error:
            return []

    def set_broker_grants(self, grants: frozenset[str]) -> None:
        """An agent Session's grants: for the running kernel's broker and every replacement."""
        self.session_grants = grants
        if self.broker is not None:
            self.broker.grants = grants

    async def cleanup(self, restart: bool = False) -> None:
        """Releases the kernel's resources once its tree is gone (the watchdog, the broker, the history,
        the policy file...); a restart keeps what the next kernel reuses."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.broker is not None and not restart:
            self.broker.close()
        await super().cleanup(restart)
        if self.history_recorder is not None:  # the tree is gone: nothing more is written to its history
            # On this thread: cleanup also runs from atexit hooks, where no new thread may start. Each
            # execution's end already recorded its copies, so this pass has little left to hash.
            if restart:
                self.history_recorder.record()
            else:
                self.history_recorder.close()
                self.history_recorder = None
        if self.policy_file:
            with contextlib.suppress(OSError):
                os.unlink(self.policy_file)
            self.policy_file = None
        if not restart:
            if self.relay is not None:
                self.relay.close()
                self.relay = None
            if self.workspace_files is not None:
                self.workspace_files.end()
                self.workspace_files = None
            if self.egress_proxy is not None:
                self.egress_proxy.close()
                self.egress_proxy = None
            if self._sandbox_folder is not None:
                self._sandbox_folder.remove()
                self._sandbox_folder = None
            if self.exchange_dir is not None:
                shutil.rmtree(self.exchange_dir, ignore_errors=True)
                self.exchange_dir = None
            if self._host_pipe is not None:
                for fd in self._host_pipe:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self._host_pipe = None


CHANNEL_NAMES = ("shell", "iopub", "stdin", "control", "hb")


def on_this_machine(address: str) -> bool:
    """A loopback, unspecified or local interface's address (the relay may bind any of them)."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    local = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(ip) in local


# What a provisioner takes over from the spare it adopts (the relay is rebuilt on the new ports).
ADOPTED = (
    "policy_file",
    "broker_comm_id",
    "broker",
    "_launch_args",
    "sandboxed",
    "sandbox_reason",
    "egress_proxy",
    "_kernel_side",
    "workspace_files",
    "_sandbox_folder",
    "exchange_dir",
    "history_recorder",
    "_supervisor",
    "_supervisor_process",
    "_host_pipe",
    "process",
    "pid",
    "pgid",
    "cwd",
)


def _discard(process: subprocess.Popen[bytes] | None) -> None:
    """A bwrap that did not build the sandbox: reaped, its pipes closed (it wrote what it had to say)."""
    if process is None:
        return
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=SUPERVISOR_KILL_BUDGET_S)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def _required_but(why: str) -> str:
    return (
        f"ivralo: this kernel must run in an OS sandbox (sandbox='required'), but {why}. Install "
        "bubblewrap or allow user namespaces, or set sandbox='auto' to run with the Python guards "
        "and Landlock only."
    )


def _ask_running_execution(watchdog: Watchdog) -> str | None:
    """(any thread but the watchdog's) The execution the kernel is running, asked over control."""
    answered = threading.Event()
    box: list[str | None] = []

    def on_reply(reply: dict[str, Any]) -> None:
        executing = (reply.get("content") or {}).get("executing")
        box.append(executing if isinstance(executing, str) else None)
        answered.set()

    watchdog.send_control(names.MSG_STATUS_REQUEST, {}, on_reply)
    answered.wait(NOTE_WAIT_S)
    return box[0] if box else None
