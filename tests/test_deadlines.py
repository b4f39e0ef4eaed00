"""Every row of the failure table, against real kernels: answered within the bound, namespace kept
or lost exactly as the message says, no process left behind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import gone, kernel_in_tree, wait_until
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager
from kernel_helpers import execute, raw_client

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.agent.session_calls import RunResult
from ivralo_kernel.host.watch.escalation import Phase

DEADLINE_MS, GRACE_MS = 1500, 700
BOUND_S = (DEADLINE_MS + GRACE_MS + 250) / 1000
# Liveness slack for a loaded 2-core CI machine; precision is measured in bench/, not asserted here.
SLACK_S = 0.75
CONFIG = WorkerConfig(deadline_ms=DEADLINE_MS, interrupt_grace_ms=GRACE_MS, observer_poll_ms=100)
INTERRUPTED = f"interrupted: exceeded deadline_ms={DEADLINE_MS}; namespace preserved (partial side effects possible)"

INTERRUPTIBLE = {
    "python loop": "while True: pass",
    "time.sleep": "import time\ntime.sleep(60)",
    "await asyncio.sleep": "import asyncio\nawait asyncio.sleep(60)",
    "child process": "import subprocess\nsubprocess.run(['sleep', '60'])",
}


async def timed(session: Session, code: str) -> tuple[float, object]:
    start = time.monotonic()
    result = await session.run(code)
    return time.monotonic() - start, result


@pytest.mark.parametrize("code", INTERRUPTIBLE.values(), ids=INTERRUPTIBLE.keys())
async def test_interruptible_cells_keep_the_namespace(workspace: Path, code: str) -> None:
    async with Session(workspace=workspace, config=CONFIG) as session:
        await session.run("kept = 'still here'")
        elapsed, result = await timed(session, code)
        assert result == {"status": "error", "result": "", "error": INTERRUPTED}
        assert DEADLINE_MS / 1000 <= elapsed <= BOUND_S + SLACK_S, elapsed
        escalation = list(session.watchdog.escalations.values())[-1]  # type: ignore[union-attr]
        wait_until(lambda: escalation.phase.final, 2, "the watchdog to see the idle too")
        # The kernel's idle, then the tree's quiet (what the kernel says alone could be forged).
        assert escalation.path == [Phase.RUNNING, Phase.INTERRUPTING, Phase.SETTLING, Phase.INTERRUPTED]
        assert await session.run("print(kept)") == "still here\n"


async def test_busy_thread_left_by_the_user_is_answered_and_the_message_tells_the_truth(workspace: Path) -> None:
    """A user thread spinning in pure Python starves the kernel's other threads of the GIL for
    seconds (CPython gives it back to whichever waiter wins), so the interrupt may not land within
    the grace. Either way the caller is answered in time, and what it is told is true."""
    code = (
        "import threading\ndef spin():\n    while True: pass\n"
        "t = threading.Thread(target=spin, daemon=True)\nt.start()\nt.join()"
    )
    async with Session(workspace=workspace, config=CONFIG) as session:
        await session.run("kept = 'still here'")
        elapsed, result = await timed(session, code)
        assert isinstance(result, dict) and elapsed <= BOUND_S + SLACK_S, elapsed
        if result["error"] == INTERRUPTED:
            assert await session.run("print(kept)") == "still here\n"
        else:
            assert result["error"].startswith("REPL worker terminated (timeout: execution exceeded deadline_ms=1500")
            assert "were lost: kept." in result["error"]
            assert await session.run("print('kept' in dir())") == "False\n"


# Code in the kernel says its cell is over (IOPub idle, forged with the kernel's own session) and
# cancels the supervisor's backstop on the kernel's pipe, then computes, ignoring SIGINT.
FORGES_IDLE_AND_DISARMS = """
import os, signal
from ivralo_kernel.kernel.launch_state import STATE
k = get_ipython().kernel
parent = k.get_parent('shell')
k.session.send(k.iopub_socket, 'status', {'execution_state': 'idle'}, parent=parent, ident=k._topic('status'))
os.write(STATE.pipe._fd, f"kill-at:{parent['header']['msg_id']}:off\\n".encode())
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
"""


async def assert_the_liar_is_ended(workspace: Path, code: str) -> None:
    async with Session(workspace=workspace, config=CONFIG) as session:
        await session.run("pass")
        assert session.supervisor_pid is not None
        kernel = kernel_in_tree(session.supervisor_pid)
        elapsed, result = await timed(session, code)
        assert isinstance(result, dict), result
        assert result["error"].startswith("REPL worker terminated (timeout: execution exceeded"), result
        assert elapsed <= BOUND_S + SLACK_S, elapsed
        wait_until(lambda: gone(kernel), 1, "the kernel that lied to be gone")


async def test_a_cell_that_forges_idle_and_disarms_is_still_ended(workspace: Path) -> None:
    """Judged from outside: the kernel's process is gone, and the caller answered, within deadline +
    grace + 250 ms, though the kernel told everyone that the cell was over."""
    await assert_the_liar_is_ended(workspace, FORGES_IDLE_AND_DISARMS)


# As above, and from a thread it keeps forging the next execution every 0.3 s: "idle" for the last
# fake one, "busy" for a fresh msg_id no client sent. Each fake would end the one before it, well
# before its own deadline, if the host believed a "busy" it cannot trace to a client's request.
FORGES_THE_NEXT_EXECUTION = FORGES_IDLE_AND_DISARMS.replace(
    "signal.signal(",
    """import threading, time, uuid
def chain():
    last = parent
    while True:
        fake = {**parent, 'header': {**parent['header'], 'msg_id': uuid.uuid4().hex}}
        for state, p in (('idle', last), ('busy', fake)):
            k.session.send(k.iopub_socket, 'status', {'execution_state': state}, parent=p, ident=k._topic('status'))
        last = fake
        time.sleep(0.3)
threading.Thread(target=chain, daemon=True).start()
signal.signal(""",
)


async def test_a_cell_that_forges_the_next_execution_is_still_ended(workspace: Path) -> None:
    """The sandbox's relay shows the host every request clients send: a "busy" for one no client
    sent does not end the execution that is really running."""
    await assert_the_liar_is_ended(workspace, FORGES_THE_NEXT_EXECUTION)


# Code in the kernel asks the host about a host "for the person" (a question nobody will answer),
# so that the deadline pauses, then computes. From a thread: the cell itself goes on.
FORGES_A_QUESTION = """
import threading, time
from ivralo_kernel.kernel.broker_client import BROKER
ask = lambda: BROKER.ask('egress', {'host': 'nobody.invalid', 'port': 443, 'person': True}, 600)
threading.Thread(target=ask, daemon=True).start()
time.sleep(0.2)
while True:
    pass
"""


async def test_a_forged_question_does_not_stop_the_deadline(workspace: Path) -> None:
    """The host pauses a deadline only while its tree is quiet. Judged by a client that is not the
    agent API (whose own fallback would mask the watchdog): the cell ends within deadline + grace
    + 250 ms, interrupted (the loop takes the KeyboardInterrupt)."""
    from ivralo_kernel.host.jupyter.manager import IvraloKernelManager

    manager = IvraloKernelManager.for_settings(
        python=sys.executable, sandbox="off", deadline_ms=DEADLINE_MS, interrupt_grace_ms=GRACE_MS
    )
    await manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        start = time.monotonic()
        # The host's question reaches this client now (the fallback's relay): a person who does not answer.
        reply = await client.execute_interactive(
            FORGES_A_QUESTION, timeout=BOUND_S + SLACK_S + 5, stdin_hook=lambda _msg: None
        )
        elapsed = time.monotonic() - start
        assert reply["content"]["status"] == "error", reply["content"]
        assert elapsed <= BOUND_S + SLACK_S, elapsed
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


# Messages no Jupyter message is, each signed with the session's key (which the kernel holds):
# too few parts, a header that is not an object, a status without an id; and unsigned garbage.
# Published from the cell on the kernel's own IOPub socket, before a loop that never ends.
PUBLISHES_MALFORMED = """
kernel = get_ipython().kernel
signed = lambda *parts: [b"<IDS|MSG>", kernel.session.sign(list(parts)), *parts]
for frames in (
    signed(b'{"msg_type": "status"}'),
    signed(b"[1]", b"{}", b"{}", b"{}"),
    signed(b'{"msg_type": "status"}', b"{}", b"{}", b'{"execution_state": "idle"}'),
    [b"<IDS|MSG>", b"x"],
    [b"no delimiter"],
):
    kernel.iopub_socket.send_multipart(frames)
while True:
    pass
"""


async def test_malformed_iopub_messages_do_not_stop_the_watchdog(workspace: Path) -> None:
    """Code in the kernel can publish anything on IOPub; the host's watchdog, which reads it, goes
    on: the loop after it is still stopped at its deadline (without the watchdog, never)."""
    from ivralo_kernel.host.jupyter.manager import IvraloKernelManager

    manager = IvraloKernelManager.for_settings(
        python=sys.executable, sandbox="off", deadline_ms=DEADLINE_MS, interrupt_grace_ms=GRACE_MS
    )
    await manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        msg_id = client.execute(PUBLISHES_MALFORMED)  # the reply on shell: IOPub's garbage is every client's
        deadline = time.monotonic() + 30
        while True:
            reply = await client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "error", reply["content"]
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


def test_a_kill_time_left_for_a_crashed_kernel_does_not_end_its_restart(workspace: Path) -> None:
    """jupyter_server's restarter restarts a crashed kernel on the same host pipe. A kill time the
    host wrote there for the crashed kernel's execution (which its supervisor never read: it was gone)
    is not the new kernel's: its cell is interrupted at its own deadline, never killed before it.
    (The soak saw it: a lab kernel restarted after a crash was ended within seconds, variables lost.)"""
    from jupyter_client.manager import KernelManager

    from ivralo_kernel.protocol.pipe import KillAt, encode

    km = KernelManager(kernel_name="ivralo")
    km.kernel_spec.metadata["kernel_provisioner"]["config"].update(
        {"deadline_ms": DEADLINE_MS, "interrupt_grace_ms": GRACE_MS}
    )
    km.start_kernel(cwd=str(workspace))
    try:
        crashing = km.client()
        crashing.start_channels()
        crashing.wait_for_ready(timeout=60)
        crashing.execute("import os; os._exit(1)")  # the crash
        wait_until(lambda: not km.is_alive(), 30, "the kernel's crash")
        crashing.stop_channels()
        # What the crashed kernel's watchdog may leave on the pipe: a kill time that falls inside the
        # next kernel's first long cell (its restart takes about a second), before that cell's deadline.
        stale = encode(KillAt("the-crashed-kernels-cell", time.monotonic() + 2.5))
        os.write(km.provisioner._host_pipe[1], stale)  # type: ignore[union-attr]
        km.restart_kernel(now=True, newports=True)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        execute(kc, "kept = 'the same kernel'")
        result = execute(kc, "import time\ntime.sleep(4)\nprint('slept')", timeout=30)
        assert result.reply["content"].get("ename") == "KeyboardInterrupt", result.reply["content"]
        assert execute(kc, "print(kept)").stdout == "the same kernel\n", "the kernel was ended and replaced"
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


# A short sleep first lets the kernel's IOPub thread publish "busy" before native code takes the
# GIL, so the host watchdog sees the execution and its escalation path can be asserted.
NATIVE_AFTER_START = "import time\ntime.sleep(0.2)\nsum(range(10**11))"


async def test_native_code_ignoring_sigint_is_killed_and_names_are_lost(workspace: Path) -> None:
    async with Session(workspace=workspace, config=CONFIG) as session:
        await session.run(
            "import subprocess\nx, y = 1, 2\ndaemon = subprocess.Popen(['sleep', '300'], start_new_session=True)"
        )
        # Found from outside, in the kernel's tree (inside its sandbox the kernel sees other pids).
        assert session.supervisor_pid is not None
        tree = psutil.Process(session.supervisor_pid).children(recursive=True)
        daemon_pid = next(p.pid for p in tree if p.cmdline() == ["sleep", "300"])
        kernel_pid, watchdog = session.pid, session.watchdog
        elapsed, result = await timed(session, NATIVE_AFTER_START)
        assert isinstance(result, dict) and result["status"] == "error"
        error = result["error"]
        assert error.startswith(
            f"REPL worker terminated (timeout: execution exceeded deadline_ms={DEADLINE_MS}; observer: "
        )
        assert error.endswith(
            "ALL variables in this session were lost: daemon, subprocess, x, y. The names the stopped call "
            "assigns may also be lost: time. You must recreate any state you need before retrying."
        )
        assert result["result"] == "", "the message is said once, in error"
        assert "rss=" in error and "state=" in error
        assert elapsed <= BOUND_S + SLACK_S, elapsed
        path = list(watchdog.escalations.values())[-1].path  # type: ignore[union-attr]
        assert path == [Phase.RUNNING, Phase.INTERRUPTING, Phase.CONFIRMING, Phase.KILLED]
        for pid in (daemon_pid, kernel_pid):
            wait_until(lambda pid=pid: gone(pid), 2, f"pid {pid} of the killed tree to be gone")
        assert await session.run("print('x' in dir())") == "False\n", "the next call gets a fresh worker"


@pytest.mark.parametrize(
    "code",
    ["sum(range(10**11))", "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')"],
    ids=["sum(range) from the first line", "catastrophic regex"],
)
async def test_gil_holding_cells_are_still_answered_within_the_bound(workspace: Path, code: str) -> None:
    """Native code from a cell's first line starves the kernel's IOPub thread: the host may never see
    "busy". The supervisor's backstop, registered before the cell ran, still ends it in time (the
    regex checks signals, so when the host does see it, an interrupt ends it instead)."""
    async with Session(workspace=workspace, config=CONFIG) as session:
        await session.run("kept = 1")
        elapsed, result = await timed(session, code)
        assert isinstance(result, dict)
        assert (
            result["error"].startswith(
                f"REPL worker terminated (timeout: execution exceeded deadline_ms={DEADLINE_MS}; observer: "
            )
            or result["error"] == INTERRUPTED
        )
        assert elapsed <= BOUND_S + SLACK_S, elapsed


async def test_without_interrupt_before_kill_the_deadline_kills_at_once(workspace: Path) -> None:
    """The loss is said once, in ``error``; ``result`` keeps what the call printed before it; the
    names the killed call assigns (from its code) are named as "may also be lost"."""
    config = WorkerConfig(deadline_ms=DEADLINE_MS, interrupt_before_kill=False, observer_poll_ms=100)
    async with Session(workspace=workspace, config=config) as session:
        await session.run("kept = 1")
        code = "print('before the loss', flush=True)\nfound = 2\nimport time\ntime.sleep(60)\ndef later(): pass"
        elapsed, result = await timed(session, code)
        assert isinstance(result, dict) and "timeout: execution exceeded" in result["error"]
        assert (
            "were lost: kept. The names the stopped call assigns may also be lost: found, later, time. You must"
            in (result["error"])
        ), "names of the last successful call, then the killed call's own"
        assert result["result"] == "before the loss\n", result
        assert elapsed <= DEADLINE_MS / 1000 + 0.25 + SLACK_S


async def _running_call(session: Session, workspace: Path) -> asyncio.Task[RunResult]:
    """A minute-long call, once its cell says it runs (a file it writes: the handshake)."""
    started = workspace / "started"
    started.unlink(missing_ok=True)
    in_flight = asyncio.create_task(
        session.run("import time, pathlib\npathlib.Path('started').touch()\ntime.sleep(60)")
    )
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the cell never started"
        await asyncio.sleep(0.02)
    return in_flight


async def test_esc_stops_at_once_and_lists_the_lost_names(workspace: Path) -> None:
    async with Session(workspace=workspace, config=WorkerConfig()) as session:
        await session.run("a = 1\nb = 2")
        in_flight = await _running_call(session, workspace)
        start = time.monotonic()
        answer = await session.interrupt()
        result = await in_flight
        assert time.monotonic() - start < 1.0 + SLACK_S, "Esc does not wait for a grace period"
        expected = (
            "REPL worker terminated (interrupted: stopped at once by the user). ALL variables in this "
            "session were lost: a, b. The names the stopped call assigns may also be lost: pathlib, time. "
            "You must recreate any state you need before retrying."
        )
        assert answer == result == {"status": "error", "result": "", "error": expected}
        assert await session.run("print('a' in dir())") == "False\n"


def _our_tree(before: set[int]) -> set[int]:
    """The processes under this test's process that were not there ``before`` the session: its kernel's
    tree (bwrap, supervisor, kernel). The whole suite's pytest has other children (servers)."""
    return {p.pid for p in psutil.Process().children(recursive=True) if not gone(p.pid)} - before


async def test_restart_starts_a_fresh_kernel_before_it_returns(workspace: Path) -> None:
    lost_text = (
        "REPL worker terminated (restarted: ended by the user's restart; a fresh kernel takes its place). "
        "ALL variables in this session were lost: {}. You must recreate any state you need before retrying."
    )
    before = _our_tree(set())
    async with Session(workspace=workspace, config=WorkerConfig()) as session:
        assert await session.restart() is None, "no kernel ran: nothing lost, one started all the same"
        first = session.pid
        assert first is not None and not gone(first)
        await session.run("a = 1\nb = 2")
        assert session.pid == first, "the call ran in the kernel restart had made ready"
        old_tree = _our_tree(before)
        assert first in old_tree

        answer = await session.restart()
        message = lost_text.format("a, b")
        assert answer == {"status": "error", "result": "", "error": message}  # the loss once, in error
        fresh = session.pid
        assert fresh is not None and fresh != first and not gone(fresh), "the fresh kernel runs already"
        wait_until(lambda: all(gone(pid) for pid in old_tree), 10, f"the old tree {old_tree} to be gone")
        assert await session.run("print('a' in dir())") == "False\n"

        # During a call: the call returns the same loss, and the fresh kernel is there when restart returns.
        await session.run("c = 3")
        in_flight = await _running_call(session, workspace)
        old_tree = _our_tree(before)
        answer = await session.restart()
        message = lost_text.format("c").replace(
            " You must", " The names the stopped call assigns may also be lost: pathlib, time. You must"
        )
        assert answer == await in_flight == {"status": "error", "result": "", "error": message}
        assert session.pid not in (None, fresh) and not gone(session.pid)  # type: ignore[arg-type]
        wait_until(lambda: all(gone(pid) for pid in old_tree), 10, f"the old tree {old_tree} to be gone")
        assert await session.run("print('c' in dir())") == "False\n"


async def test_memory_soft_limit_hint_once_and_hard_limit_kill(workspace: Path) -> None:
    config = WorkerConfig(
        observer_poll_ms=50, memory_soft_limit_bytes=200 << 20, memory_hard_limit_bytes=700 << 20, deadline_ms=30_000
    )
    async with Session(workspace=workspace, config=config) as session:
        first = await session.run("import time\nblob = b'x' * (300 << 20)\ntime.sleep(0.5)\nprint('allocated')")
        assert isinstance(first, str)
        assert first.startswith("allocated\n[ivralo memory] RSS ")
        assert first.endswith(" exceeds the 200.00 MiB soft limit — delete objects you no longer need (del name)\n")
        assert await session.run("print('again')") == "again\n", "one hint per episode"
        result = await session.run("more = b'y' * (600 << 20)\ntime.sleep(5)")
        assert isinstance(result, dict)
        assert "REPL worker terminated (memory: RSS " in result["error"]
        assert f"exceeded memory_hard_limit_bytes={700 << 20}" in result["error"]
        assert "were lost: blob, time." in result["error"]


def test_in_kernel_deadline_for_a_raw_launch(workspace: Path, tmp_path: Path) -> None:
    """VS Code's path: no provisioner. The raw launch's host watchdog interrupts (the kernel shows
    the deadline's message) and ends the tree when the interrupt cannot land; the supervisor's
    backstop, which only that host can disarm, catches what it misses. Either way: status 124."""
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-raw.json"))
    argv = [part.format(connection_file=connection_file) for part in spec.argv]
    env = dict(os.environ, IVRALO_DEADLINE_MS=str(DEADLINE_MS), IVRALO_INTERRUPT_GRACE_MS=str(GRACE_MS))
    with subprocess.Popen(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        client = raw_client(connection_file)
        try:
            client.wait_for_ready(timeout=60)
            execute(client, "kept = 1")
            start = time.monotonic()
            interrupted = execute(client, "while True: pass")
            assert interrupted.reply["content"]["traceback"] == [INTERRUPTED]
            assert DEADLINE_MS / 1000 <= time.monotonic() - start <= BOUND_S + SLACK_S
            assert execute(client, "print(kept)").stdout == "1\n"
            kernel_pid = kernel_in_tree(proc.pid)
            start = time.monotonic()
            client.execute("sum(range(10**11))")
            assert proc.wait(timeout=BOUND_S + SLACK_S + 2) == 124, "the supervisor ended it for the deadline"
            assert time.monotonic() - start <= BOUND_S + SLACK_S
            assert gone(kernel_pid)
            said = proc.stderr.read()  # type: ignore[union-attr]
            assert b"outlived its deadline" in said or b"exceeded deadline_ms=" in said, said[-2000:]
        finally:
            client.stop_channels()
            if proc.poll() is None:
                proc.kill()
    assert sys.executable
