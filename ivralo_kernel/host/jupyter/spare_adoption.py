"""[host] The warm pool's side of ``IvraloProvisioner`` (a mixin): which spare kernel may stand for
this launch (its ``SpareKey``), adopting one whole (its ``KernelResources`` and its process), and
asking the pool (host/jupyter/prewarm.py) for more of its kind after a notebook's kernel starts.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ivralo_kernel.host.jupyter import prewarm
from ivralo_kernel.host.jupyter.kernel_resources import KernelResources
from ivralo_kernel.host.jupyter.prewarm import PER_KERNEL_ENV, SPARE_FLAG, Recipe, Spare, SpareKey, fingerprint
from ivralo_kernel.host.sandbox.channel_relay import ChannelRelay

if TYPE_CHECKING:
    from ivralo_kernel.host.jupyter.egress_gate import GatedKernel
    from ivralo_kernel.protocol import KernelPolicy

PreLaunch = Callable[..., Awaitable[dict[str, Any]]]
# What a provisioner takes over from the spare it adopts besides its resources: LocalProvisioner's own.
PROCESS = ("process", "pid", "pgid", "cwd")


class SpareAdoption:
    spare_key: SpareKey | None = None  # the warm-pool key of this provisioner's kernel (host.prewarm)
    is_spare = False  # this kernel waits in the pool for a notebook
    adopted_pid: int | None = None  # the spare kernel this provisioner took over, if it did
    _launched = False  # a first launch may adopt a spare; a restart launches a fresh kernel
    _adopting: Spare | None = None
    _spare_env: dict[str, str] | None = None

    if TYPE_CHECKING:  # IvraloProvisioner's, LocalProvisioner's and IvraloSettings' own
        parent: Any
        resources: KernelResources
        connection_info: Any
        process: Any
        log: Any
        kernel_spec: Any
        spares: Any
        sandbox: Any
        spare_idle_ttl_seconds: Any
        host_memory_reserve_bytes: Any

        def policy_for(self, cwd: str) -> KernelPolicy: ...

        def kernel_settings(self) -> dict[str, Any]: ...

        def ask_person(self, execution: str, prompt: str) -> str | None: ...

        def gated(self) -> GatedKernel: ...

    def _spare_to_adopt(self, kwargs: dict[str, Any]) -> Spare | None:
        """On the first launch only (a restart launches a fresh kernel): a spare of this kind, if one waits."""
        self.is_spare = kwargs.pop(SPARE_FLAG, None) is not None
        if self._launched:
            return None
        self._launched = True
        self.spare_key = self._spare_key_for(kwargs) if (self.spares > 0 or self.is_spare) else None
        return prewarm.POOL.take(self.spare_key) if self.spare_key is not None and not self.is_spare else None

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

    async def _adopt(self, spare: Spare, kwargs: dict[str, Any], pre_launch: PreLaunch) -> dict[str, Any]:
        """Take a spare's kernel and every guard around it; the clients' channels are relayed to its
        sockets. The new kernel's connection file carries the spare's key (its kernel checks it)."""
        other = spare.provisioner
        km = self.parent
        assert km is not None
        km.session.key = other.connection_info["key"]
        kwargs = await pre_launch(**kwargs)  # LocalProvisioner's: the connection file, the new ports, the spare's key
        # Its resources whole (ours start a watchdog in post_launch, and a relay, on the new clients'
        # channels), and its process.
        self.resources, other.resources = other.resources.handed_over(), KernelResources()
        for name in PROCESS:
            setattr(self, name, getattr(other, name))
            setattr(other, name, None)
        resources = self.resources
        resources.relay = ChannelRelay(
            dict(self.connection_info), dict(resources.kernel_side or {}), watch_requests=True
        )
        resources.relay.start()
        if resources.egress is not None:
            resources.egress.serve(self.gated())  # this notebook's ports and people now
        if resources.broker is not None:
            resources.broker.egress.person = self.ask_person  # asked on this provisioner's relay
        self._adopting = spare
        self.adopted_pid = int(self.process.pid) if self.process is not None else None
        self.log.info("ivralo: a warm spare kernel (pid %s) serves this notebook", self.adopted_pid)
        return kwargs

    def _want_spares(self) -> None:
        """After a notebook's kernel starts: keep ``spares`` more of its kind ready."""
        km, key = self.parent, self.spare_key
        if key is None or self.is_spare or self.spares <= 0 or not self.resources.launch.sandboxed or km is None:
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
