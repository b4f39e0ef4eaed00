"""[kernel] What the kernel says about the OS sandbox it runs in, or about running without one.

The host decides the mode and passes it in ``IVRALO_SANDBOX``: ``bwrap`` inside a sandbox, anything
else is the reason there is none (the fallback). ``kernel_info``'s ``ivralo.layers``, the banner and
``ivralo-kernel doctor`` all say which mode is in force and what it does not stop.
"""

from __future__ import annotations

from ivralo_kernel.protocol import audience, names
from ivralo_kernel.protocol.sandbox import container
from ivralo_kernel.protocol.sandbox.modes import FALLBACK_GAPS, SANDBOX_LAYER

EGRESS_LAYER = (
    f"only through the host's egress proxy (127.0.0.1:{names.RELAY_PORT}; HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)"
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


FALLBACK_DIRECT_REFUSAL = (
    "ivralo network guard: {host} cannot be reached by a direct connection: this kernel runs without "
    "ivralo's sandbox, and the OS (Landlock's TCP rule) lets its processes connect only to ivralo's proxy "
    "(127.0.0.1:{port}). HTTP and HTTPS go through it, and it asks about hosts it does not know "
    "(requests, urllib, httpx, pip, curl and git use it by themselves, through HTTPS_PROXY); for a "
    "database, use ivralo.sql with databases.json. " + audience.TELL_THE_PERSON
)
NO_TCP_RULE = (
    "a subprocess or ctypes can connect to any TCP port directly (Landlock's TCP rule needs ABI 4, "
    "Linux >= 6.7; the proxy variables are only a convention)"
)


def fallback_network(proxy: int | None, tcp_rule: bool) -> str:
    """What holds for the network in the fallback: the host's proxy with the OS's TCP rule, or less."""
    if proxy is None:
        return "not contained: the Python guard asks the host; other processes are not stopped"
    way = f"through the host's egress proxy (127.0.0.1:{proxy}; HTTP_PROXY, HTTPS_PROXY, ALL_PROXY)"
    if tcp_rule:
        return f"only {way}: Landlock's TCP rule refuses every other TCP connect of the kernel's tree"
    return f"{way}; {NO_TCP_RULE}"


NO_SCOPE = (
    "; another kernel's processes can connect to this kernel's Jupyter sockets (abstract unix sockets: "
    "Landlock's scope needs ABI 6, Linux >= 6.12)"
)


def fallback_gaps(proxy: int | None, tcp_rule: bool, landlock: str = "") -> str:
    gaps = FALLBACK_GAPS
    if proxy is not None and tcp_rule:
        gaps = FALLBACK_GAPS.replace("can reach the network directly, ", "can ")
    elif proxy is not None:
        gaps = FALLBACK_GAPS.replace("can reach the network directly", NO_TCP_RULE)
    if proxy is not None and "abstract-socket-scope" not in landlock:
        gaps += NO_SCOPE
    if "fs-read" not in landlock:
        gaps += NO_READ_FLOOR.format(why=landlock)
    return gaps


def sandbox_layers(mode: str, landlock: str, proxy: int | None = None, tcp_rule: bool = False) -> dict[str, str]:
    if mode == names.SANDBOX_BWRAP:
        return {
            "sandbox": SANDBOX_LAYER,
            "network": EGRESS_LAYER,
            "network_guard": "audit hook: direct connections refused with the reason (the OS has no route anyway)",
        }
    guard = "audit hook, asks the host"
    if proxy is not None and tcp_rule:
        guard = "audit hook: direct connections refused with the reason (Landlock's TCP rule refuses them anyway)"
    return {
        "sandbox": f"none ({_in_words(mode) or 'started without an ivralo host'})",
        "network": fallback_network(proxy, tcp_rule),
        "network_guard": guard,
        "not_stopped": fallback_gaps(proxy, tcp_rule, landlock),
    }


def _in_words(mode: str) -> str:
    """The host's reason, without bwrap's sysctl hint where that does not apply (a container)."""
    return container.without_host_advice(mode) if container.detect() else mode


def fallback_note(mode: str, proxy: int | None = None, tcp_rule: bool = False, landlock: str = "") -> str:
    why = _in_words(mode) or "started without an ivralo host (a raw launch of kernel.json's command)"
    gaps = fallback_gaps(proxy, tcp_rule, landlock)
    note = f"no OS sandbox ({why}): running on the Python guards and Landlock only. Not stopped in this mode: {gaps}."
    inside = container.detect()  # a hint only: the settings that close these gaps where it runs
    if inside is None:
        return note
    return f"{note} {inside.advice()}. {inside.gaps(gaps)}."


SECCOMP_LAYER = (
    "io_uring, keyrings, bpf, perf events, userfaultfd, AF_VSOCK, new namespaces and mounts, ptrace and "
    "other processes' memory, kernel modules, TIOCSTI/TIOCLINUX refused (EPERM; clone3: ENOSYS)"
)

# The fallback's own part of the filter (protocol/sandbox/seccomp.py: base_filter(fallback=True)).
SECCOMP_FALLBACK_SOCKETS = (
    "in the fallback the network is TCP only: UDP (so DNS), raw, ICMP, MPTCP and SCTP sockets, AF_PACKET and "
    "families other than unix/inet/inet6/netlink, and TCP Fast Open refused"
)


SECCOMP_FALLBACK_UDP = (
    "in the fallback the network is TCP and UDP (direct links are allowed, landlock_network, and their names "
    "resolve by DNS): raw, ICMP, MPTCP and SCTP sockets, AF_PACKET and families other than unix/inet/inet6/"
    "netlink, and TCP Fast Open refused"
)


def seccomp_report(installed_by: str, direct_links: bool = False) -> str:
    """What the layer report says of the base filter, from the supervisor's word and this process's
    own status (a filter the supervisor thinks it installed but this process lacks is not there)."""
    from ivralo_kernel.protocol.sandbox.seccomp import filters_in_force

    if installed_by == "supervisor" and filters_in_force() > 0:  # the supervisor installs it in the fallback only
        sockets = SECCOMP_FALLBACK_UDP if direct_links else SECCOMP_FALLBACK_SOCKETS
        return f"{SECCOMP_LAYER}; {sockets}; installed by {installed_by}"
    if installed_by == "bwrap" and filters_in_force() > 0:
        return f"{SECCOMP_LAYER}; installed by {installed_by}"
    return installed_by or "none: started without the supervisor"
