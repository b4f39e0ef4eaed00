"""[host] What the provisioner holds for the one kernel it runs, as objects: the sandbox launch
(``SandboxLaunch``, host/jupyter/kernel_tree.py), the egress gate (host/jupyter/egress_gate.py),
the relay, the watchdog, the broker and the workspace's files, in one ``KernelResources``.

So that each of the provisioner's three moves over them is one call: adopting a warm spare takes the
spare's resources whole (``handed_over``), cleaning up releases them in their order (``close``), and
egress is decided by the gate. ``Resource`` keeps the provisioner's attribute names (``watchdog``,
``relay``, ``sandboxed``, ...) as views of these fields, for the code and the tests that read them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from ivralo_kernel.host.jupyter.kernel_tree import SandboxLaunch
from ivralo_kernel.host.sandbox.exchange_folder import remove_exchange_folder

if TYPE_CHECKING:
    from ivralo_kernel.host.broker.responder import BrokerResponder
    from ivralo_kernel.host.history.ledger import HistoryRecorder
    from ivralo_kernel.host.jupyter.egress_gate import EgressGate
    from ivralo_kernel.host.sandbox.channel_relay import ChannelRelay
    from ivralo_kernel.host.settings.workspace_files import WorkspaceFiles
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket
    from ivralo_kernel.host.watch.watchdog import Watchdog

T = TypeVar("T")


@dataclass
class KernelResources:
    launch: SandboxLaunch = field(default_factory=SandboxLaunch)
    egress: EgressGate | None = None  # the egress proxy and its decisions (started once per provisioner)
    relay: ChannelRelay | None = None  # clients' channels <-> the sandboxed kernel's ipc sockets
    kernel_side: dict[str, Any] | None = None  # the kernel's own connection info (inside the sandbox)
    watchdog: Watchdog | None = None
    broker: BrokerResponder | None = None
    broker_comm_id: str | None = None  # this kernel's broker comm (kept by a replacement kernel)
    broker_socket: BrokerSocket | None = None  # the kernel's requests and their answers (new for each launch)
    policy_file: str | None = None
    workspace_files: WorkspaceFiles | None = None  # the workspace's files as the host trusts them
    exchange_dir: str | None = None  # the namespace API's shared-memory folder (host.dataplane)
    history_recorder: HistoryRecorder | None = None  # records the write guard's copies (host.history_ledger)

    def handed_over(self) -> KernelResources:
        """These resources, for the provisioner that adopts their kernel: the watchdog and the relay
        were the spare manager's (its ports); the adopter starts its own on its clients' channels."""
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        return self

    def close(self, restart: bool) -> None:
        """The kernel's tree is gone. A restart keeps what its next kernel uses again (the broker's
        asker, the relay, the proxy, the folders); otherwise everything goes."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.broker_socket is not None:  # the next launch makes its own
            self.broker_socket.close()
            self.broker_socket = None
        if self.broker is not None and not restart:
            self.broker.close()
        if self.history_recorder is not None:  # nothing more is written to its history
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
        if restart:
            return
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        if self.workspace_files is not None:
            self.workspace_files.end()
            self.workspace_files = None
        if self.egress is not None:
            self.egress.close()
            self.egress = None
        if self.exchange_dir is not None:
            remove_exchange_folder(self.exchange_dir)
            self.exchange_dir = None
        self.launch.close()


class Resource(Generic[T]):
    """A provisioner attribute that is a field of its ``resources`` (a dotted path into them)."""

    def __init__(self, path: str) -> None:
        *self._parents, self._leaf = path.split(".")

    def _owner(self, provisioner: Any) -> Any:
        owner = provisioner.resources
        for name in self._parents:
            owner = getattr(owner, name)
        return owner

    @overload
    def __get__(self, provisioner: None, kind: type | None = None) -> Resource[T]: ...

    @overload
    def __get__(self, provisioner: object, kind: type | None = None) -> T: ...

    def __get__(self, provisioner: object | None, kind: type | None = None) -> T | Resource[T]:
        if provisioner is None:
            return self
        return cast("T", getattr(self._owner(provisioner), self._leaf))

    def __set__(self, provisioner: object, value: T) -> None:
        setattr(self._owner(provisioner), self._leaf, value)
