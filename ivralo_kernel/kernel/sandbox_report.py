"""[kernel] What the kernel says about the OS sandbox it runs in, or about running without one.

The host decides the mode and passes it in ``IVRALO_SANDBOX``: ``bwrap`` inside a sandbox, anything
else is the reason there is none (the fallback). ``kernel_info``'s ``ivralo.layers``, the banner and
``ivralo-kernel doctor`` all say which mode is in force and what it does not stop.
"""

from __future__ import annotations

from ivralo_kernel.protocol import audience, names

SANDBOX_LAYER = (
    "bwrap: user, mount, pid, ipc, uts, net and cgroup namespaces; root file system read-only, workspace "
    "writable, .git/.ivralo/databases.json read-only, .env unreadable, credential stores empty, no unix "
    "socket of the machine, "
    "only this sandbox's processes"
)
EGRESS_LAYER = (
    f"only through the host's egress proxy (127.0.0.1:{names.RELAY_PORT}; HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)"
)
FALLBACK_GAPS = (
    "a subprocess or ctypes can reach the network directly, write .git/ and .ivralo/ inside the "
    "workspace, read .env and the files outside it that the read floor allows; run as "
    "root, it can read other processes' environments"
)
NO_READ_FLOOR = (
    "; Landlock's read floor is not in force ({why}): any process reads other kernels' connection files, "
    "Jupyter's runtime folder and the credential stores (~/.ssh, ~/.aws, ...)"
)
SANDBOX_DIRECT_REFUSAL = (
    "ivralo network guard: {host} cannot be reached by a direct connection: this kernel runs in "
    "ivralo's sandbox, which has no network of its own and does no DNS. HTTP and HTTPS go through "
    "ivralo's proxy, which asks about hosts it does not know (requests, urllib, httpx, pip, curl and "
    "git use it by themselves, through HTTPS_PROXY); for a database, use ivralo.sql with databases.json. "
    + audience.TELL_THE_PERSON
)


def sandbox_layers(mode: str, landlock: str) -> dict[str, str]:
    if mode == names.SANDBOX_BWRAP:
        return {
            "sandbox": SANDBOX_LAYER,
            "network": EGRESS_LAYER,
            "network_guard": "audit hook: direct connections refused with the reason (the OS has no route anyway)",
        }
    return {
        "sandbox": f"none ({mode or 'started without an ivralo host'})",
        "network": "not contained: the Python guard asks the host; other processes are not stopped",
        "network_guard": "audit hook, asks the host",
        "not_stopped": FALLBACK_GAPS + ("" if "fs-read" in landlock else NO_READ_FLOOR.format(why=landlock)),
    }


def fallback_note(mode: str, landlock: str = "fs-read") -> str:
    why = mode or "started without an ivralo host (a raw launch of kernel.json's command)"
    return (
        f"no OS sandbox ({why}): running on the Python guards and Landlock only. Not stopped in this mode: "
        f"{FALLBACK_GAPS}{'' if 'fs-read' in landlock else NO_READ_FLOOR.format(why=landlock)}."
    )


SECCOMP_LAYER = (
    "io_uring, keyrings, bpf, perf events, userfaultfd, AF_VSOCK, new namespaces and mounts, ptrace and "
    "other processes' memory, kernel modules, TIOCSTI/TIOCLINUX refused (EPERM; clone3: ENOSYS)"
)

# The fallback's own part of the filter (protocol/seccomp.py: base_filter(fallback=True)).
SECCOMP_FALLBACK_SOCKETS = (
    "in the fallback the network is TCP only: UDP (so DNS), raw, ICMP, MPTCP and SCTP sockets, AF_PACKET and "
    "families other than unix/inet/inet6/netlink, and TCP Fast Open refused"
)


def seccomp_report(installed_by: str) -> str:
    """What the layer report says of the base filter, from the supervisor's word and this process's
    own status (a filter the supervisor thinks it installed but this process lacks is not there)."""
    from ivralo_kernel.protocol.seccomp import filters_in_force

    if installed_by == "supervisor" and filters_in_force() > 0:  # the supervisor installs it in the fallback only
        return f"{SECCOMP_LAYER}; {SECCOMP_FALLBACK_SOCKETS}; installed by {installed_by}"
    if installed_by == "bwrap" and filters_in_force() > 0:
        return f"{SECCOMP_LAYER}; installed by {installed_by}"
    return installed_by or "none: started without the supervisor"
