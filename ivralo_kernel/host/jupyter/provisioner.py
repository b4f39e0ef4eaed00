"""[host] ``IvraloProvisioner``: the host side of every ivralo kernel that jupyter_client starts.

jupyter_server (JupyterLab), ``jupyter console``, nbclient and agents all pick it up from
``kernel.json``. It scrubs credentials from the environment before exec, writes the launch policy
to a read-only file, and ends kernels through the supervisor so that the whole tree goes:
jupyter_client's own ``kill`` SIGKILLs the process group, which kills the supervisor before it
can clean up and leaves ``setsid`` children behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import tempfile
import uuid
from typing import Any

import psutil
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets.config import Config

from ivralo_kernel import compat
from ivralo_kernel.host.broker.responder import BrokerResponder
from ivralo_kernel.host.history.ledger import HistoryRecorder
from ivralo_kernel.host.jupyter import prewarm
from ivralo_kernel.host.jupyter.egress_gate import EgressGate, GatedKernel
from ivralo_kernel.host.jupyter.kernel_resources import KernelResources, Resource
from ivralo_kernel.host.jupyter.kernel_tree import SIGNAL_KILL_NOW, SUPERVISOR_KILL_BUDGET_S, discard  # noqa: F401 - kept here too
from ivralo_kernel.host.jupyter.kernel_watch import KernelWatch, killed_cell_text  # noqa: F401 - its text, named here too
from ivralo_kernel.host.jupyter.person_dialogs import DIALOGS
from ivralo_kernel.host.jupyter.spare_adoption import SpareAdoption
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.sandbox import memory_cgroup
from ivralo_kernel.host.sandbox.bwrap import SandboxUnavailable, choose_bwrap
from ivralo_kernel.host.sandbox.channel_relay import ChannelRelay
from ivralo_kernel.host.sandbox.egress import PERSON_ANSWER_TIMEOUT_S
from ivralo_kernel.host.sandbox.egress_proxy import EgressProxy
from ivralo_kernel.host.sandbox.exchange_folder import clear_exchange_folder, create_exchange_folder
from ivralo_kernel.host.sandbox.kernel_output import relay_output
from ivralo_kernel.host.sandbox.launch import SandboxFolder, SandboxStart, kernel_connection, sandboxed_command
from ivralo_kernel.host.sandbox.memory_cgroup import KernelCgroup
from ivralo_kernel.host.sandbox.person_question import split_prompt
from ivralo_kernel.host.sandbox.plan import dotenv_for_kernel, dotenv_set_aside, prepare_workspace
from ivralo_kernel.host.settings.file_problems import settings_file_lines
from ivralo_kernel.host.settings.resolve import IvraloSettings, config_file_layers
from ivralo_kernel.host.settings.workspace_files import DOTENV, PERMISSIONS, WorkspaceFiles, protected_in_sandbox
from ivralo_kernel.host.watch.broker_socket import BrokerSocket
from ivralo_kernel.host.watch.watchdog import Watchdog
from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub
from ivralo_kernel.protocol.credentials import credential_store_paths, kept_out_line
from ivralo_kernel.protocol.sandbox import devices
from ivralo_kernel.protocol.trust import is_trusted


class IvraloProvisioner(KernelWatch, SpareAdoption, LocalProvisioner, IvraloSettings):  # type: ignore[misc,metaclass]
    """Its settings are ``IvraloSettings``' (host/settings/resolve.py): Jupyter's config path
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
        self.resources = KernelResources()
        super().__init__(**kwargs)
        self.check()

    # The running kernel's resources (host/jupyter/kernel_resources.py), under the names other code reads.
    policy_file = Resource[str | None]("policy_file")
    broker_comm_id = Resource[str | None]("broker_comm_id")
    watchdog = Resource[Watchdog | None]("watchdog")
    broker = Resource[BrokerResponder | None]("broker")
    broker_socket = Resource[BrokerSocket | None]("broker_socket")
    relay = Resource[ChannelRelay | None]("relay")
    _kernel_side = Resource[dict[str, Any] | None]("kernel_side")
    workspace_files = Resource[WorkspaceFiles | None]("workspace_files")
    exchange_dir = Resource[str | None]("exchange_dir")
    history_recorder = Resource[HistoryRecorder | None]("history_recorder")
    sandboxed = Resource[bool]("launch.sandboxed")
    sandbox_reason = Resource[str]("launch.sandbox_reason")
    _launch_args = Resource[tuple[list[str], dict[str, Any]] | None]("launch.launch_args")
    _sandbox_folder = Resource[SandboxFolder | None]("launch.folder")
    _supervisor = Resource[int | None]("launch.supervisor")
    _supervisor_process = Resource[psutil.Process | None]("launch.supervisor_process")
    _host_pipe = Resource[tuple[int, int] | None]("launch.host_pipe")
    kernel_cgroup = Resource[KernelCgroup | None]("launch.cgroup")
    cgroup_report = Resource[str]("launch.cgroup_report")
    session_grants: frozenset[str] | None = None  # an agent Session's grants replace the configured ones
    bwrap_report = ""  # which bwrap builds it and why (the others passed over), for the banner
    _sandbox_failed = ""  # bwrap could not build this provisioner's sandbox: later starts fall back at once
    _fallback_launch: tuple[list[str], dict[str, str]] | None = None  # this launch without bwrap (auto)
    _released_when_dead = False  # the restarter's "dead" callback is registered

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
            devices=devices.resolve(self.devices)[0],
        )

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """jupyter_client's step before the launch: adopts a ready spare, or builds the sandboxed command
        (the policy, the sandbox, the exchange folder, the broker and the relay)."""
        spare = self._spare_to_adopt(kwargs)
        if spare is not None:
            return await self._adopt(spare, kwargs, super().pre_launch)
        policy = self.policy_for(str(kwargs.get("cwd") or os.getcwd()))
        bwrap = self._choose_sandbox()
        if self.kernel_cgroup is None:  # before the tree runs a line: it starts inside (join_command)
            # First: memory_cgroup='required' without one fails here, before anything else is made.
            self.kernel_cgroup, self.cgroup_report = memory_cgroup.make(
                self.memory_cgroup, self.memory_hard_limit_bytes, self.memory_limit_bytes
            )
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
        lines = self.workspace_files.begin(protected)
        lines += filter(None, [dotenv_set_aside(policy.workspace)])
        lines += settings_file_lines(policy.workspace, problems, self.workspace_files.usable(PERMISSIONS))
        for line in lines:
            self.log.warning("ivralo: %s", line)
            env[names.ENV_HOST_NOTES] = "\n".join(filter(None, (env.get(names.ENV_HOST_NOTES), line)))
        # The workspace's .env is read here, never by the kernel: only its plain values go in.
        env.update(dotenv_for_kernel(policy.workspace, env, self.workspace_files.usable(DOTENV)))
        if removed:  # names only: values never reach a log
            self.log.info("ivralo: %s", kept_out_line(removed))
        self.policy_file = self._write_policy(policy)
        # A fresh responder per kernel (a "yes" lasts until this kernel restarts); the asker stays.
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
            exchange_dir=self.exchange_dir,
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
        # The broker's socket: new for each kernel (a dead one may have left half a frame in the old).
        if self.broker_socket is not None:
            self.broker_socket.close()
        self.broker_socket = BrokerSocket()
        kwargs["pass_fds"] = self.broker_socket.pass_to(env, kwargs["pass_fds"])
        # The kernel's Jupyter links are ipc sockets in its run folder, relayed by the host, with or
        # without the sandbox: the person is asked on the relay, and the fallback's TCP rule cuts nothing.
        cmd, inner_file, connection_file = self._relayed(list(kwargs["cmd"]), abstract=bwrap is None)
        env[names.ENV_EGRESS_SOCKET] = self._egress_socket()
        env[names.ENV_RELAY_PORT] = str(names.RELAY_PORT_ANY)  # the fallback's: the supervisor picks one
        self._add_host_note(env, f"Memory: {self.cgroup_report}")
        launch = self.resources.launch
        if bwrap is None:
            env[names.ENV_SANDBOX] = self.sandbox_reason
            kwargs["cmd"] = launch.in_cgroup(cmd)
            return kwargs
        self._fallback_launch = (list(kwargs["cmd"]), dict(env))  # if bwrap exits without building it
        self._add_host_note(env, f"OS sandbox built with {self.bwrap_report}")
        launch.bwrap = bwrap
        sandboxed = self._sandboxed(bwrap, policy, cmd, env, inner_file, connection_file)
        kwargs["cmd"] = launch.in_cgroup(sandboxed)
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
        if self.resources.egress is None:
            self.resources.egress = EgressGate(folder.egress_socket, self.gated())
        return folder.egress_socket

    def gated(self) -> GatedKernel:
        """This provisioner, as the egress gate reads it."""
        return self

    @property
    def egress_proxy(self) -> EgressProxy | None:
        """This kernel's egress proxy (the sandbox's one way to the network), or None without one."""
        return self.resources.egress.proxy if self.resources.egress is not None else None

    def clients_connection_file(self) -> str:
        """The connection file jupyter_client wrote for the clients (the relay's side)."""
        return str(getattr(self.parent, "connection_file", "") or "")

    def _relayed(self, cmd: list[str], abstract: bool) -> tuple[list[str], str, str]:
        """``cmd`` with the kernel's own connection file, and the relay between it and the clients'.
        Returns the command, the kernel's connection file and the clients'."""
        folder = self._sandbox_folder
        assert folder is not None
        # The kernel's sockets are ipc files in its run folder; the clients' (TCP as Jupyter's default, or
        # what they asked for) are the relay's, outside the sandbox. The relay also shows the host every
        # request clients send on shell, which code in the kernel cannot forge.
        connection_file = self.clients_connection_file()
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
        self,
        bwrap: str,
        policy: KernelPolicy,
        cmd: list[str],
        env: dict[str, str],
        inner_file: str,
        connection_file: str,
    ) -> list[str]:
        folder = self._sandbox_folder
        assert folder is not None
        return sandboxed_command(
            bwrap,
            folder,
            policy.workspace,
            cmd,
            env,
            read_only_files=tuple(p for p in (inner_file, self.policy_file) if p),
            tool_files=tuple(self.tool_files),
            credential_stores=credential_store_paths(os.environ, self.credential_stores),
            jupyter_runtime_dir=os.path.dirname(connection_file) or None,
            exchange_dir=self.exchange_dir or "",
            memory_hard_limit_bytes=self.memory_hard_limit_bytes,
            tmpfs_size_bytes=self.tmpfs_size_bytes,
            devices=policy.devices,
        )

    def ask_person(self, execution: str, prompt: str) -> str | None:
        """(any thread; blocks) The person's answer at ``execution``'s input prompt, asked by the host
        on the clients' side of the relay, which code in the kernel can neither write nor read. No
        relay (no sandbox: the kernel binds the clients' sockets itself): nobody the host can ask."""
        relay = self.relay
        if relay is None:
            return None
        # A page with ivralo's JupyterLab extension asks as a dialog (host/jupyter/person_dialogs.py).
        split = split_prompt(prompt)
        if split is not None and DIALOGS.by_dialog(self.kernel_id, relay.client_session(execution)):
            question, choices = split

            def ended() -> bool:  # its reply went out, or the relay closed (the kernel is replaced)
                return relay.closed or relay.replied(execution)

            return DIALOGS.ask(str(self.kernel_id), execution, question, choices, PERSON_ANSWER_TIMEOUT_S, ended)
        return relay.ask(execution, prompt, PERSON_ANSWER_TIMEOUT_S)

    def supervisor_pid(self) -> int | None:
        """The supervisor's pid, as the host sees it (inside a sandbox, bwrap's processes come first)."""
        return self.resources.launch.supervisor_pid(self.process)

    def host_pid(self, kernel_pid: int) -> int:
        """The host's pid of the kernel that reports ``kernel_pid`` (its pid in the sandbox)."""
        return self.resources.launch.host_pid(self.process, kernel_pid)

    def _write_policy(self, policy: KernelPolicy) -> str:
        # Beside the connection file, in the runtime dir: private to the user, cleaned with the kernel.
        runtime = os.path.dirname(self.clients_connection_file()) or None
        if runtime and not os.path.isdir(runtime):
            runtime = None
        fd, path = tempfile.mkstemp(prefix="ivralo-policy-", suffix=".json", dir=runtime)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(policy.to_json())
        os.chmod(path, stat.S_IRUSR)  # the kernel reads it; nothing should rewrite it
        return path

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
            failure = await off_loop(start.wait, process, self.resources.launch.bwrap or cmd[0])
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
        discard(self.process)
        if self.sandbox == "required" or self._fallback_launch is None:
            await self.cleanup(restart=False)
            self.process = None  # nothing runs: jupyter_client sees no kernel
            raise SandboxUnavailable(_required_but(failure))
        # The relay and the egress proxy stay: the fallback's kernel uses them as the sandbox's would,
        # on abstract sockets (the relay is rebuilt for them).
        self._sandbox_failed = self.sandbox_reason = failure
        cmd, env = self._fallback_launch
        cmd = self.resources.launch.in_cgroup(self._relayed(cmd, abstract=True)[0])
        env = {**env, names.ENV_SANDBOX: self.sandbox_reason}
        kwargs = {**kwargs, "env": env}
        self._launch_args = (list(cmd), compat.popen_kwargs(kwargs))
        info = await super().launch_kernel(cmd, **kwargs)
        relay_output(self.process)
        return info

    async def post_launch(self, **kwargs: Any) -> None:
        """After the launch: starts the watchdog, lets go of an adopted spare's files, tops up the spares."""
        await super().post_launch(**kwargs)
        if self.broker_socket is not None:  # the kernel holds its end (a sandbox's fallback launch too)
            self.broker_socket.launched()
        self._start_watchdog()
        self._release_when_dead()
        if self._adopting is not None:
            prewarm.POOL.discard(self._adopting)  # its manager's files (connection file, control socket)
            self._adopting = None
        self._want_spares()

    def _release_when_dead(self) -> None:
        """After ``restart_limit`` crashes in a row jupyter_client's restarter gives up and fires "dead";
        jupyter_server then drops the kernel from its map without shutting it down, so no cleanup runs:
        its folders, segments, relay and proxy stayed until the server exited, and the folders after it
        (found by the soak: a notebook crashing every few seconds). Registered once: the restarter
        outlives restarts (``KernelManager.start_restarter`` makes one per manager)."""
        manager = self.parent
        if self._released_when_dead or manager is None or not hasattr(manager, "add_restart_callback"):
            return
        manager.add_restart_callback(self._on_dead, "dead")
        self._released_when_dead = True

    def _on_dead(self) -> None:
        """(the server's loop) The restarter gave up on this kernel: nothing will restart or shut it down."""
        self.log.warning("ivralo: the kernel died and its restarts failed; its folders and relay are released")
        self.resources.close(restart=False)

    def _backstop_line(self, execution: str, kill_at: float | None) -> None:
        """(watchdog thread) Arm or disarm the supervisor's backstop for one execution."""
        self.resources.launch.backstop_line(execution, kill_at)

    def _interrupt_now(self) -> None:
        """(watchdog thread) SIGINT to the supervisor, which passes it on to the kernel's group."""
        self.resources.launch.interrupt(self.process)

    async def poll(self) -> int | None:
        """The kernel's exit code, or None while it runs (or is being replaced after a kill)."""
        if self._replacing:  # between the kill and the relaunch the kernel is not dead, it is being replaced
            return None
        return await super().poll()

    def kill_tree_now(self) -> None:
        """End the kernel's whole tree, from any thread: ask the supervisor, then SIGKILL what is left.

        jupyter_client's own kill SIGKILLs the process group, which kills the supervisor before it
        can clean up and leaves ``setsid`` children behind.
        """
        self.resources.launch.kill_tree(self.process)

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

    def set_broker_grants(self, grants: frozenset[str]) -> None:
        """An agent Session's grants: for the running kernel's broker and every replacement."""
        self.session_grants = grants
        if self.broker is not None:
            self.broker.grants = grants

    async def cleanup(self, restart: bool = False) -> None:
        """Releases the kernel's resources once its tree is gone (the watchdog, the broker, the history,
        the policy file...); a restart keeps what the next kernel reuses."""
        try:
            await super().cleanup(restart)
        finally:
            self.resources.close(restart)


def _required_but(why: str) -> str:
    return (
        f"ivralo: this kernel must run in an OS sandbox (sandbox='required'), but {why}. Install "
        "bubblewrap or allow user namespaces, or set sandbox='auto' to run with the Python guards "
        "and Landlock only."
    )
