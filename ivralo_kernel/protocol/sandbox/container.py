"""[protocol] Whether this process runs in a container, which runtime's, and the settings that let
bubblewrap build the full sandbox there.

Used only to *say* things (the banner, ``ivralo-kernel doctor``): no guard or decision depends on it,
so a wrong answer costs a wrong hint, never a protection. In a container the distribution's advice
(bwrap's own "sysctl kernel.unprivileged_userns_clone=1") does not apply: the container's seccomp
profile, AppArmor profile and masked ``/proc`` are what refuse the namespaces, and they are set where
the container is started.

The signals, read in this order: the Kubernetes service variables (``KUBERNETES_SERVICE_HOST``, set
in every pod), ``/run/.containerenv`` (Podman), ``/.dockerenv`` (Docker), then the cgroup paths of
``/proc/1/cgroup`` and ``/proc/self/cgroup`` (docker, kubepods, containerd, libpod, crio).

``IVRALO_CONTAINER_ROOT`` (a test hook, docs/security.md "Containers"): the folder these files are
read under instead of ``/``, so a test can show a fake ``.dockerenv`` to doctor. It can only change
the hint doctor prints.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_CONTAINER_ROOT = "IVRALO_CONTAINER_ROOT"
DOCKER, PODMAN, KUBERNETES, OTHER = "Docker", "Podman", "Kubernetes", "a container runtime"
CGROUP_MARKS: tuple[tuple[str, str], ...] = (("kubepods", KUBERNETES), ("libpod", PODMAN), ("docker", DOCKER))
CGROUP_MARKS += (("crio", KUBERNETES), ("containerd", OTHER))
SECCOMP_FILE = "ivralo-seccomp.json"
SECCOMP_MADE = f"{SECCOMP_FILE}, which deploy/container/make_seccomp_profile.py makes from Docker's default"
DOCS = "docs/remote.md, 'Containers: the full sandbox'"

# What each runtime needs so that bwrap can build the sandbox: a seccomp profile that allows user
# namespaces and mount (Docker's default refuses them without CAP_SYS_ADMIN), no AppArmor profile
# that refuses mount, and a /proc without masked paths (bwrap mounts a fresh /proc, which the kernel
# refuses over a /proc with paths covered).
SETTINGS = {
    DOCKER: (
        f"docker run --security-opt seccomp={SECCOMP_FILE} (or seccomp=unconfined) "
        "--security-opt apparmor=unconfined --security-opt systempaths=unconfined"
    ),
    PODMAN: (
        f"podman run --security-opt seccomp={SECCOMP_FILE} (or seccomp=unconfined) "
        "--security-opt apparmor=unconfined --security-opt unmask=ALL"
    ),
    KUBERNETES: (
        "the pod's spec.hostUsers: false, and the container's securityContext procMount: Unmasked, "
        f"seccompProfile {{type: Localhost, localhostProfile: {SECCOMP_FILE}}} (in each node's "
        "/var/lib/kubelet/seccomp/) and appArmorProfile {type: Unconfined}"
    ),
}
SETTINGS[OTHER] = f"where the container is started, as for Docker: {SETTINGS[DOCKER]}"

# Each gap the fallback can have, the words that name it in sandbox_report's ``not_stopped`` (any of
# them), and the part of the full sandbox that closes it once the settings above let bwrap build it.
# Only the gaps ``not_stopped`` names are listed: a gap the fallback itself closes drops out.
GAP_CLOSERS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    ((".git", ".env"), ".git/, .ivralo/ and .env inside the workspace", "read-only and covered mounts"),
    (
        ("unix socket",),
        "unix sockets of the machine (tmux, docker.sock, ssh-agent)",
        "an empty /tmp, /run and runtime folder",
    ),
    (
        ("network",),
        "direct network connections",
        "a network namespace of its own, egress only through the host's proxy",
    ),
    (("credential",), "credential stores and files outside the workspace", "a mount table without them"),
    (
        ("environments", "other processes"),
        "other processes and their environments",
        "a pid namespace and a fresh /proc",
    ),
)


@dataclass(frozen=True)
class Container:
    """The runtime (``DOCKER``, ``PODMAN``, ``KUBERNETES`` or ``OTHER``) and what showed it."""

    runtime: str
    signal: str

    @property
    def settings(self) -> str:
        return SETTINGS[self.runtime]

    def advice(self) -> str:
        """One sentence: what to set where this container is started for the full sandbox."""
        return (
            f"In this container ({self.runtime}: {self.signal}) user namespaces and mount are refused by the "
            f"container's own settings, not by this machine's kernel: for the full sandbox, start it with "
            f"{self.settings} ({SECCOMP_MADE}; {DOCS})"
        )

    def gaps(self, not_stopped: str) -> str:
        """Each gap ``not_stopped`` names, with what closes it once the settings are given."""
        named = [(gap, closer) for words, gap, closer in GAP_CLOSERS if any(w in not_stopped for w in words)]
        closed = "; ".join(f"{gap}: {closer}" for gap, closer in named) or "every one"
        return f"With {self.runtime}'s settings above, the full sandbox closes each gap: {closed}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def detect(environ: Mapping[str, str] | None = None) -> Container | None:
    """The container this process runs in, or None where no signal shows one."""
    env = os.environ if environ is None else environ
    root = Path(env.get(ENV_CONTAINER_ROOT) or "/")
    if env.get("KUBERNETES_SERVICE_HOST"):
        return Container(KUBERNETES, "KUBERNETES_SERVICE_HOST is set")
    if (root / "run/.containerenv").exists():
        return Container(PODMAN, "/run/.containerenv exists")
    if (root / ".dockerenv").exists():
        return Container(DOCKER, "/.dockerenv exists")
    for name in ("proc/1/cgroup", "proc/self/cgroup"):
        text = _read(root / name)
        for mark, runtime in CGROUP_MARKS:
            if mark in text:
                return Container(runtime, f"/{name} names {mark}")
    return None


# bwrap's own hint when it cannot create a namespace: a sysctl of the machine, which in a container is
# neither the cause nor settable from inside.
_BWRAP_SYSCTL_HINT = re.compile(
    r"(, likely because the kernel does not allow non-privileged user namespaces)?\.?"
    r"\s*On e\.g\. debian this can be enabled with '[^']*'\.?"
)


def without_host_advice(text: str) -> str:
    """``text`` (bwrap's words) without its guess of the cause and its sysctl hint, for a container."""
    return _BWRAP_SYSCTL_HINT.sub("", text)
