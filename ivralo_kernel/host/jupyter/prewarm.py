"""[host] Warm spare kernels for Jupyter's hosts (JupyterLab): ``spares`` per workspace and kernelspec.

One pool per host process (a module-level singleton), keyed by ``SpareKey``: the workspace, the
kernelspec and a fingerprint of everything that shapes the kernel (every setting, the launch policy,
the kernelspec's argv and env, the host's environment). The server cannot know folders in advance,
so a key's pool fills after the first kernel of that workspace starts; opening the next notebook
there takes a spare and a background thread starts another.

A spare is a whole provisioned kernel: a blocking ``KernelManager`` (its own connection file, in
the runtime folder) whose ``IvraloProvisioner`` built the sandbox, policy file, broker, egress proxy
and watchdog exactly as for a notebook. Only sandboxed spares are kept: their kernel binds ``ipc``
files in its own run folder, so the provisioner that adopts one relays the new kernel's ports to
those sockets and takes every guard over (``IvraloProvisioner._adopt``).

Bounded (``spares`` per key), an idle TTL (``spare_idle_ttl_seconds``: a spare nobody took is ended,
whole tree, and its key is not refilled until a kernel of that workspace starts again), and a memory
reserve (``host_memory_reserve_bytes``: no spare starts below it, and spares are ended first). Every
spare is ended when the host process exits (``atexit``); if it is killed, each spare's supervisor
sees the host's pipe close and ends its tree.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Names in the launch environment that differ per notebook and do not shape the kernel.
PER_KERNEL_ENV = frozenset({"JPY_SESSION_NAME", "JPY_PARENT_PID"})
SPARE_FLAG = "ivralo_spare"  # start_kernel(**{SPARE_FLAG: key}): this launch is a spare of that key
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SpareKey:
    workspace: str
    kernel_name: str
    fingerprint: str


def fingerprint(*parts: Any) -> str:
    """A digest of what shapes a kernel (it may include the environment's values: never logged)."""
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Recipe:
    """How to start a spare of one key: the kernelspec, where, with which config and environment."""

    kernel_name: str
    kernel_spec_manager: Any
    config: Any
    env: dict[str, str]
    cwd: str
    target: int  # spares to keep
    ttl_s: float
    reserve_bytes: int
    log: Any = None  # the host's logger (jupyter_server's): what the pool does shows in the server's log


def _log(recipe: Recipe) -> Any:
    return recipe.log if recipe.log is not None else log


@dataclass
class Spare:
    key: SpareKey
    km: Any  # jupyter_client.KernelManager (blocking)
    born: float = field(default_factory=time.monotonic)

    @property
    def provisioner(self) -> Any:
        return self.km.provisioner

    @property
    def pid(self) -> int | None:
        process = getattr(self.provisioner, "process", None)
        return int(process.pid) if process is not None else None


class SparePool:
    """Ready spares by key, and one background thread that starts, sweeps and ends them."""

    def __init__(self, start: Callable[[SpareKey, Recipe], Spare | None] | None = None) -> None:
        self._ready: dict[SpareKey, list[Spare]] = {}
        self._recipes: dict[SpareKey, Recipe] = {}
        self._starting: dict[SpareKey, int] = {}
        self._jobs: list[Callable[[], None]] = []  # ends and discards, run by the pool's thread
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._start = start or start_spare
        self.started = 0  # spares started over the pool's life (for tests and doctor)

    # -- from the host's threads ----------------------------------------------------------------
    def take(self, key: SpareKey) -> Spare | None:
        """A ready spare of this key (the oldest), or None. Its key refills in the background."""
        with self._cond:
            spares = self._ready.get(key) or []
            while spares:
                spare = spares.pop(0)
                process = getattr(spare.km.provisioner, "process", None)
                if process is not None and process.poll() is None:
                    self._cond.notify_all()
                    return spare
                self._jobs.append(lambda spare=spare: end_spare(spare))  # type: ignore[misc]  # died waiting
            return None

    def want(self, key: SpareKey, recipe: Recipe) -> None:
        """Keep ``recipe.target`` spares of this key (called after each kernel of the key starts)."""
        with self._cond:
            if self._closed or recipe.target <= 0:
                return
            self._recipes[key] = recipe
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ivralo-spares", daemon=True)
                self._thread.start()
                atexit.register(self.close)
            self._cond.notify_all()

    def ready_pids(self, key: SpareKey | None = None) -> list[int]:
        with self._cond:
            keys = [key] if key is not None else list(self._ready)
            return [pid for k in keys for s in self._ready.get(k, []) if (pid := s.pid) is not None]

    def wait_ready(self, count: int, timeout: float, key: SpareKey | None = None) -> bool:
        """(tests, bench) Until ``count`` spares are ready, under a deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.ready_pids(key)) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def discard(self, spare: Spare) -> None:
        """A spare whose kernel a provisioner took over: its manager's own files go, on our thread."""
        with self._cond:
            self._jobs.append(lambda: discard_adopted(spare))
            self._cond.notify_all()

    def keys(self) -> list[SpareKey]:
        with self._cond:
            return list(self._recipes)

    def close(self) -> None:
        """End every spare (whole tree) and the thread; new wants are ignored after this. The pool's
        thread does the ending (it owns the managers' event loop), and we wait for it."""
        with self._cond:
            self._closed = True
            for spares in self._ready.values():
                self._jobs.extend(lambda spare=spare: end_spare(spare) for spare in spares)  # type: ignore[misc]
            self._ready.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=READY_TIMEOUT_S + 30)

    # -- the pool's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                job = self._next_job()
                if job is None:
                    return
                job()
        finally:  # the loop jupyter_client's blocking calls made for this thread
            with contextlib.suppress(RuntimeError):
                asyncio.get_event_loop_policy().get_event_loop().close()

    def _next_job(self) -> Callable[[], None] | None:
        with self._cond:
            while True:
                if self._jobs:
                    return self._jobs.pop(0)
                if self._closed:
                    return None
                now = time.monotonic()
                wake = None
                for key, recipe in list(self._recipes.items()):
                    spares = self._ready.setdefault(key, [])
                    for spare in list(spares):
                        if now - spare.born >= recipe.ttl_s:  # nobody took it: end it, stop refilling
                            spares.remove(spare)
                            self._recipes.pop(key, None)
                            _log(recipe).info("ivralo: ended an unused spare kernel of %s (idle TTL)", key.workspace)
                            return lambda spare=spare: end_spare(spare)  # type: ignore[misc]
                        due = spare.born + recipe.ttl_s
                        wake = due if wake is None else min(wake, due)
                    if len(spares) + self._starting.get(key, 0) < recipe.target:
                        if not _memory_allows(recipe.reserve_bytes):
                            continue
                        self._starting[key] = self._starting.get(key, 0) + 1
                        return lambda key=key, recipe=recipe: self._fill(key, recipe)  # type: ignore[misc]
                self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _fill(self, key: SpareKey, recipe: Recipe) -> None:
        spare = None
        try:
            spare = self._start(key, recipe)
        except Exception:  # noqa: BLE001 - a spare that does not start: the next notebook starts cold
            _log(recipe).warning("ivralo: a spare kernel for %s did not start", key.workspace, exc_info=True)
        with self._cond:
            closed = self._closed
        if closed and spare is not None:  # before close() stops waiting for us
            end_spare(spare)
            spare = None
        with self._cond:
            self._starting[key] -= 1
            if spare is not None and not self._closed and key not in self._recipes:
                self._jobs.append(lambda: end_spare(spare))  # its key timed out meanwhile
            elif spare is not None and not self._closed:
                self._ready.setdefault(key, []).append(spare)
                self.started += 1
                # Which process waits, for which folder: the server's log shows it (tests wait on it)
                _log(recipe).info(
                    "ivralo: a warm spare kernel (pid %s) is ready for %s (%s)",
                    spare.pid,
                    key.workspace,
                    key.kernel_name,
                )
            elif key in self._recipes:
                self._recipes.pop(key)  # it failed: no retry loop; the next kernel of the key asks again
            self._cond.notify_all()


def _memory_allows(reserve: int) -> bool:
    from ivralo_kernel.host.sandbox.limits import available_memory

    return available_memory() >= reserve


def start_spare(key: SpareKey, recipe: Recipe) -> Spare | None:
    """(the pool's thread) One spare, started like a notebook's kernel and ready (kernel_info answered)."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name=recipe.kernel_name, config=recipe.config)
    if recipe.kernel_spec_manager is not None:
        km.kernel_spec_manager = recipe.kernel_spec_manager
    km.start_kernel(env=dict(recipe.env), cwd=recipe.cwd, **{SPARE_FLAG: key})
    spare = Spare(key, km)
    provisioner = km.provisioner
    if getattr(provisioner, "spare_key", None) != key or not getattr(provisioner, "sandboxed", False):
        # It would not be the kernel the next notebook asks for (or it cannot be handed over).
        _log(recipe).info("ivralo: no spare kernels for %s: its kernels are not sandboxed or differ", key.workspace)
        end_spare(spare)
        return None
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=READY_TIMEOUT_S)
    except BaseException:
        end_spare(spare)
        raise
    finally:
        client.stop_channels()
    return spare


def end_spare(spare: Spare) -> None:
    """The spare's whole tree, then its files (policy, sandbox folder, connection file)."""
    km = spare.km
    with contextlib.suppress(Exception):
        provisioner = km.provisioner
        if provisioner is not None:
            provisioner.kill_tree_now()
            process = provisioner.process
            if process is not None:
                process.wait(timeout=5)
        km.cleanup_resources()


def discard_adopted(spare: Spare) -> None:
    """A spare whose kernel another provisioner took over: only its manager's own files go."""
    km = spare.km
    with contextlib.suppress(Exception):
        km.cleanup_resources()


def kernelspec_spares() -> dict[str, int]:
    """(doctor) The installed ivralo kernelspecs whose own provisioner config sets ``spares`` (it wins
    over the config files), by kernelspec name."""
    from jupyter_client.kernelspec import KernelSpecManager

    from ivralo_kernel.protocol import names

    found: dict[str, int] = {}
    for name, folder in sorted(KernelSpecManager().find_kernel_specs().items()):
        try:
            with open(f"{folder}/kernel.json", encoding="utf-8") as f:
                provisioner = json.load(f).get("metadata", {}).get("kernel_provisioner", {})
            if provisioner.get("provisioner_name") == names.PROVISIONER_NAME and "spares" in provisioner.get(
                "config", {}
            ):
                found[name] = int(provisioner["config"]["spares"])
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return found


POOL = SparePool()
