"""Write the seccomp profile that lets bubblewrap build ivralo's sandbox in a container: Docker's
default profile (``docker info`` names it; the file is moby's profiles/seccomp/default.json) with the
syscalls the sandbox needs allowed to a container without CAP_SYS_ADMIN.

    python deploy/container/make_seccomp_profile.py default.json > ivralo-seccomp.json

The change, as a diff of the JSON: the rules that allow ``clone`` only without namespace flags and
answer ENOSYS to ``clone3`` (for a container without CAP_SYS_ADMIN) are removed, and one rule is
added that allows ``SANDBOX_CALLS`` unconditionally. Everything else Docker refuses stays refused
(bpf, perf_event_open, keyctl, ptrace of other processes, ...). The namespaces a process creates this
way are its own: a user namespace gives it no privilege over the container or the host.

Use it with ``docker run --security-opt seccomp=ivralo-seccomp.json``, podman's same option, or, on
Kubernetes, as a Localhost profile copied to each node's /var/lib/kubelet/seccomp/.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# bwrap: clone/unshare with CLONE_NEW* (user, mount, pid, ipc, uts, net, cgroup), its mount table
# (mount, the new mount API where the C library uses it, pivot_root, umount2), setns for --userns.
SANDBOX_CALLS = (
    "clone",
    "clone3",
    "unshare",
    "setns",
    "mount",
    "mount_setattr",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
)


def _refuses_namespaces(rule: dict[str, Any]) -> bool:
    """The default's rules that keep a container without CAP_SYS_ADMIN from creating namespaces."""
    names = set(rule.get("names", []))
    without_admin = "CAP_SYS_ADMIN" in rule.get("excludes", {}).get("caps", [])
    return without_admin and bool(names & {"clone", "clone3"})


def tailored(profile: dict[str, Any]) -> dict[str, Any]:
    rules = [rule for rule in profile.get("syscalls", []) if not _refuses_namespaces(rule)]
    rules.append(
        {
            "names": list(SANDBOX_CALLS),
            "action": "SCMP_ACT_ALLOW",
            "comment": "ivralo-kernel: bubblewrap builds the kernel's sandbox (user namespaces and mount)",
        }
    )
    return {**profile, "syscalls": rules}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as source:
        profile = json.load(source)
    json.dump(tailored(profile), sys.stdout, indent="\t")
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
