"""The soak (issue 30, Must 1): N agent sessions plus a jupyter_server whose kernels are driven over
its websocket, for M minutes, each picking its next call at random (a seeded RNG per driver) from:
plain runs, 1 MB outputs, both kinds of deadline (interrupted; killed: the cell ignores SIGINT),
MemoryError, crashes (``os._exit``), interrupts during a sleep, restarts, egress questions answered by
``ask``, broker calls of a loopback API and tables (``inject_dataframe`` / ``get_dataframe``).

    make soak                                             # 8 sessions + 1 lab kernel, 10 minutes
    .venv/bin/python bench/soak.py --sessions 3 --lab-kernels 1 --minutes 2

It reports calls and p50/p99 latency per kind, and samples the host's RSS, open fds and threads (and
the jupyter_server's) every second into a plot. It fails (exit 1, one line per reason) on: a call that
exceeds its timeout (a hang); a call whose outcome is not the one its kind must give; any kernel,
supervisor or other process it saw (recorded by pid and start time) still running at the end; a
stamped ``/tmp/ivralo-*`` or ``/dev/shm/ivralo-xchg-*`` folder of this run (owned by this process,
the server or any recorded pid) left; the host's open fds at the end above those at the start plus
``--fd-slack``; the host's RSS growing past its value after the warm-up plus ``--rss-bound-mb``.

Egress: a "yes" lasts the kernel's life, so each call reaches a 127.0.0.N not yet asked in that kernel
(N from 2 to 101; every address is served by one loopback server, which counts the hits: the judge).
A lab kernel that crashes is restarted by jupyter_server's restarter and never answers the cell: the
status "restarting" on IOPub, or the kernel's new state over REST, is that call's outcome.

Writes results.json, summary.md and soak.png into bench/results/<UTC>-soak/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import selectors
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
TESTS_DIR = BENCH_DIR.parent / "tests"
RESULTS_DIR = BENCH_DIR / "results"
LAB_SPEC = "ivralo-soak"
API_KEY_NAME = "IVRALO_SOAK_API_KEY"
EGRESS_HOSTS = tuple(f"127.0.0.{n}" for n in range(2, 102))
PR_SET_CHILD_SUBREAPER = 36

SESSION_KINDS = {  # kind: weight
    "run": 3.0,
    "large_output": 1.0,
    "deadline_interrupted": 1.0,
    "deadline_killed": 0.5,
    "memory_error": 1.0,
    "crash": 0.5,
    "interrupt": 0.5,
    "restart": 0.5,
    "egress": 1.0,
    "broker": 1.0,
    "table": 1.0,
}
# The lab kernel makes the same calls, but egress (its question would need the websocket's stdin
# answered) and tables (the namespace API is the agent's).
LAB_KINDS = {kind: weight for kind, weight in SESSION_KINDS.items() if kind not in ("egress", "table")}

RUN = "x = sum(range(1000))\nprint(x)"
LARGE = "print('x' * 1_000_000)"
SLEEP = "import time\ntime.sleep({s})"
IGNORES_SIGINT = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)"
TOO_BIG = "b = bytearray({n})"
CRASH = "import os\nos._exit(1)"
BROKER = "r = ivralo.call('soak.echo', q={q!r})\nprint(r.status, r.body['path'])"
# What a lab kernel's cell says when ivralo replaced its kernel, and a request sent while it did.
ENDED = "ivralo ended this cell's kernel"
RESTARTED = "the kernel restarted during the call"  # a status "restarting"/"starting" on IOPub
STARTING_FRESH = "ivralo was starting a fresh kernel when this request arrived"
# A call of another kind that the deadline ended: on a loaded machine a 1 MB print or a table can
# take longer than deadline_ms. Counted ("cut") and listed, not failed: the deadline did its job.
DEADLINE_KINDS = ("deadline_interrupted", "deadline_killed")
CUT_MARKS = (
    "interrupted: exceeded deadline_ms=",
    "REPL worker terminated (timeout: execution exceeded deadline_ms=",
    f"{ENDED} (timeout: execution exceeded deadline_ms=",
    "inject_dataframe('t'): KeyboardInterrupt",  # the namespace call interrupted at the deadline
    "get_dataframe('t'): KeyboardInterrupt",
)
EGRESS = "import urllib.request\nprint(urllib.request.urlopen('http://{host}:{port}{path}', timeout=30).status)"


@dataclass
class Settings:
    sessions: int = 8
    lab_kernels: int = 1
    minutes: float = 10.0
    seed: int = 1
    call_timeout_s: float = 90.0  # a call longer than this is a hang
    deadline_ms: int = 3000
    grace_ms: int = 2000  # the product's default: on a loaded machine (the soak loads it) 1 s is short
    memory_limit_bytes: int = 1 << 30
    rss_bound_mb: float = 150.0
    fd_slack: int = 16
    sample_s: float = 1.0
    kinds: tuple[str, ...] = ()  # only these kinds (to chase one); empty: every kind
    # Outcomes containing one of these texts are counted and listed, not failed: a known bug, named
    # where it is given (tests/test_soak.py); the default soak tolerates nothing.
    tolerate: tuple[str, ...] = ()
    results_dir: Path = RESULTS_DIR


@dataclass
class Call:
    driver: str
    kind: str
    start: float  # seconds since the soak began
    seconds: float
    outcome: str  # "ok", "hang", or what was wrong


@dataclass
class Verdict:
    failures: list[str] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    samples: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    tolerated: list[str] = field(default_factory=list)
    out_dir: Path | None = None
    summary: str = ""
    server_log: str = ""  # the jupyter_server's own log (the lab kernels' provisioners log there)


# --- the loopback server: egress targets on 127.0.0.2-101 and the broker's API on 127.0.0.1 -----


class HitServer:
    """One port on many loopback addresses, one selector thread; each request answered in a thread
    of its own and counted as (address it reached, path, whether it carried the API key)."""

    def __init__(self, addresses: tuple[str, ...], key: str) -> None:
        self.key = key
        self.hits: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.sockets: list[socket.socket] = []
        for _ in range(20):
            try:
                self._bind_all(addresses)
                break
            except OSError:
                self._close_all()
        else:
            raise OSError(f"no port free on all of {len(addresses)} loopback addresses")
        self._sel = selectors.DefaultSelector()
        for s in self.sockets:
            self._sel.register(s, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._accept, name="soak-hits", daemon=True)
        self._thread.start()

    def _bind_all(self, addresses: tuple[str, ...]) -> None:
        port = 0
        for address in addresses:
            s = socket.socket()
            self.sockets.append(s)
            s.bind((address, port))
            s.listen(64)
            s.setblocking(False)
            port = s.getsockname()[1]
        self.port = port

    def _close_all(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets = []

    def _accept(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.2):
                with contextlib.suppress(OSError):
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    threading.Thread(target=self._answer, args=(conn,), name="soak-hit", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.setblocking(True)
            conn.settimeout(10)
            head = b""
            with contextlib.suppress(OSError):
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split()
            path = parts[1] if len(parts) > 1 else ""
            authorized = any(line.lower() == f"authorization: bearer {self.key}".lower() for line in lines[1:])
            with self._lock:
                self.hits.append((conn.getsockname()[0], path, authorized))
            body = json.dumps({"path": path}).encode()
            status = b"200 OK" if authorized or not path.startswith("/api") else b"401 Unauthorized"
            with contextlib.suppress(OSError):
                conn.sendall(
                    b"HTTP/1.0 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body
                )  # fmt: skip

    def count(self, address: str, path: str) -> int:
        with self._lock:
            return sum(1 for a, p, _ in self.hits if a == address and p == path)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sel.close()
        self._close_all()


# --- what the soak watches: the host's resources, and every process it saw ---------------------


class Watch:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.me = psutil.Process()
        self.server: psutil.Process | None = None
        self.seen: dict[tuple[int, float], str] = {}  # (pid, create_time): cmdline
        # What this process ran before the soak (in a test suite: its session's PostgreSQL server) is
        # not the soak's: neither it nor what it starts (its workers) is watched.
        self.before = {(p.pid, p.create_time()) for p in self.me.children()}

    def note_pid(self, pid: int | None) -> None:
        if pid is None:
            return
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            self.seen.setdefault((pid, p.create_time()), " ".join(p.cmdline())[:160])

    def note_descendants(self) -> None:
        tops: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            for child in self.me.children():  # orphans the soak reaps (a kernel's daemon) come here too
                with contextlib.suppress(psutil.Error):
                    if (child.pid, child.create_time()) not in self.before:
                        tops.append(child)
        if self.server is not None and self.server not in tops:
            tops.append(self.server)
        for top in tops:
            with contextlib.suppress(psutil.Error):
                for p in [top, *top.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        self.seen.setdefault((p.pid, p.create_time()), " ".join(p.cmdline())[:160])

    def sample(self) -> dict[str, float]:
        row = {
            "t": time.monotonic() - self.t0,
            "rss_mb": self.me.memory_info().rss / 2**20,
            "fds": float(self.me.num_fds()),
            "threads": float(self.me.num_threads()),
        }
        if self.server is not None:
            with contextlib.suppress(psutil.Error):
                row.update(
                    server_rss_mb=self.server.memory_info().rss / 2**20,
                    server_fds=float(self.server.num_fds()),
                    server_threads=float(self.server.num_threads()),
                )
        return row

    def still_running(self) -> list[str]:
        alive = []
        for (pid, created), cmd in self.seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {cmd}")
        return alive


# --- the agent sessions --------------------------------------------------------------------------


class AgentDriver:
    def __init__(self, name: str, soak: Soak, rng: random.Random) -> None:
        from ivralo_kernel.host import Session, WorkerConfig

        self.name, self.soak, self.rng = name, soak, rng
        self.asked: list[str] = []
        self.workspace = soak.base / "workspaces" / name
        self.workspace.mkdir(parents=True)
        config = WorkerConfig(
            deadline_ms=soak.settings.deadline_ms,
            interrupt_grace_ms=soak.settings.grace_ms,
            memory_limit_bytes=soak.settings.memory_limit_bytes,
        )
        self.session = Session(workspace=self.workspace, config=config, grants=("soak",), ask=self._ask)
        self.used_hosts: set[str] = set()  # asked about in this kernel's life
        self.life: int | None = None  # the supervisor pid of the kernel the hosts were asked in
        self.n = 0

    async def _ask(self, question: str, choices: tuple[str, ...]) -> str:
        self.asked.append(question)
        return "yes"

    def note(self) -> None:
        self.soak.watch.note_pid(self.session.pid)
        self.soak.watch.note_pid(self.session.supervisor_pid)

    async def call(self, kind: str) -> str:
        """Make one call of ``kind``; return "ok" or what was wrong."""
        s, n = self.session, self.soak.settings
        self.n += 1
        if kind == "run":
            r = await s.run(RUN)  # a result may end with a note (the restart loop's): what it starts with
            return ok(isinstance(r, str) and r.startswith("499500\n"), r)
        if kind == "large_output":
            r = await s.run(LARGE)
            return ok(isinstance(r, str) and r.startswith("x" * 1_000_000), r)
        if kind == "deadline_interrupted":
            r = await s.run(SLEEP.format(s=n.deadline_ms / 1000 + 5))
            self.note()
            return ok(is_error(r, f"interrupted: exceeded deadline_ms={n.deadline_ms}"), r)
        if kind == "deadline_killed":
            await s.run("pass")
            self.note()
            r = await s.run(IGNORES_SIGINT)
            self.lost()
            return ok(is_error(r, "REPL worker terminated (timeout: execution exceeded deadline_ms"), r)
        if kind == "memory_error":
            r = await s.run(TOO_BIG.format(n=2 * n.memory_limit_bytes))
            return ok(isinstance(r, dict) and "MemoryError" in r["error"], r)
        if kind == "crash":
            await s.run("pass")
            self.note()
            r = await s.run(CRASH)
            self.lost()
            return ok(is_error(r, "REPL worker terminated (crash"), r)
        if kind == "interrupt":
            return await self._interrupt()
        if kind == "restart":
            await s.run("kept = 1")
            self.note()
            lost = await s.interrupt()
            self.lost()
            r = await s.run("print('fresh', 'kept' in dir())")
            return ok(lost is not None and isinstance(r, str) and r.startswith("fresh False\n"), (lost, r))
        if kind == "egress":
            return await self._egress()
        if kind == "broker":
            q = f"{self.name}-{self.n}"
            r = await s.run(BROKER.format(q=q))
            hits = self.soak.hits.count("127.0.0.1", f"/api/echo?q={q}")
            return ok(isinstance(r, str) and r.startswith(f"200 /api/echo?q={q}\n") and hits == 1, (r, hits))
        if kind == "table":
            return await self._table()
        raise ValueError(kind)

    def lost(self) -> None:
        self.used_hosts.clear()
        self.life = None

    async def _interrupt(self) -> str:
        s = self.session
        await s.run("kept = 1")
        self.note()
        task = asyncio.create_task(s.run(SLEEP.format(s=self.soak.settings.deadline_ms / 1000 - 0.5)))
        limit = time.monotonic() + 30
        while not (s._worker is not None and s._worker.busy):  # the call is in the kernel
            if task.done() or time.monotonic() > limit:
                break
            await asyncio.sleep(0.005)
        await asyncio.sleep(self.rng.uniform(0.05, 0.5))  # the workload: anywhere in the sleep
        lost = await s.interrupt()
        r = await task
        self.lost()
        return ok(lost is not None and is_error(r, "REPL worker terminated") and "were lost: kept" in r["error"], r)

    async def _egress(self) -> str:
        s = self.session
        if s.supervisor_pid is None or s.supervisor_pid != self.life:
            self.used_hosts.clear()
        free = [h for h in EGRESS_HOSTS if h not in self.used_hosts]
        if not free:  # every address asked in this kernel's life: a fresh kernel asks again
            await s.interrupt()
            self.lost()
            free = list(EGRESS_HOSTS)
        host = self.rng.choice(free)
        path = f"/egress/{self.name}/{self.n}"
        asked = len(self.asked)
        r = await s.run(EGRESS.format(host=host, port=self.soak.hits.port, path=path))
        self.used_hosts.add(host)
        self.life = s.supervisor_pid
        questions = self.asked[asked:]
        hits = self.soak.hits.count(host, path)
        good = isinstance(r, str) and r.startswith("200\n") and hits == 1
        return ok(good and len(questions) == 1 and host in questions[0], (r, hits, questions))

    async def _table(self) -> str:
        import numpy as np
        import pandas as pd

        rows = self.rng.randint(1_000, 100_000)
        frame = pd.DataFrame({"a": np.arange(rows), "b": np.random.default_rng(self.n).random(rows)})
        await self.session.inject_dataframe("t", frame)
        back = await self.session.get_dataframe("t")
        return ok(back.equals(frame), f"{len(back)} rows back of {rows}")


def ok(good: bool, what: object) -> str:
    return "ok" if good else f"unexpected: {str(what)[:600]}"


def is_error(r: object, starts: str) -> bool:
    return isinstance(r, dict) and str(r.get("error", "")).startswith(starts)


# --- the lab kernels, over jupyter_server's websocket --------------------------------------------


class LabDriver:
    def __init__(self, name: str, soak: Soak, rng: random.Random, url: str, token: str) -> None:
        self.name, self.soak, self.rng, self.url, self.token = name, soak, rng, url, token
        self.session = uuid.uuid4().hex
        self.kernel_id = ""
        self.ws: Any = None
        self.n = 0
        self.replaced = False
        self.dead = False  # jupyter_server said "dead": its restarter gave up after crashes in a row

    def _rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import requests

        r = requests.request(
            method, f"{self.url}{path}", json=body, headers={"Authorization": f"token {self.token}"}, timeout=30
        )
        r.raise_for_status()
        return r.json() if r.content else {}

    async def rest(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self._rest, method, path, body)

    async def start(self) -> None:
        self.kernel_id = (await self.rest("POST", "/api/kernels", {"name": LAB_SPEC}))["id"]
        await self.connect()
        await self.wait_ready(60)

    async def connect(self) -> None:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        if self.ws is not None:
            self.ws.close()
        ws_url = self.url.replace("http://", "ws://") + f"/api/kernels/{self.kernel_id}/channels"
        request = HTTPRequest(ws_url, headers={"Authorization": f"token {self.token}"})
        self.ws = await websocket_connect(request, max_message_size=64 << 20)

    async def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.kernel_id:
            with contextlib.suppress(Exception):
                await self.rest("DELETE", f"/api/kernels/{self.kernel_id}")

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id, "msg_type": msg_type, "username": "soak", "session": self.session,
            "version": "5.4", "date": datetime.now(UTC).isoformat(),
        }  # fmt: skip
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel}
        self.ws.write_message(json.dumps({**message, "buffers": []}))
        return msg_id

    async def recv(self, until: float) -> dict[str, Any] | None:
        """The next message, or None at ``until`` (monotonic); a closed websocket is reopened."""
        left = until - time.monotonic()
        if left <= 0:
            return None
        try:
            raw = await asyncio.wait_for(self.ws.read_message(), left)
        except TimeoutError:
            return None
        if raw is None:  # the server closed it (a kernel replaced): reconnect, as a frontend does
            await self.connect()
            return {"msg_type": "ws_closed", "parent_header": {}, "content": {}}
        return json.loads(raw) if isinstance(raw, str) else None

    async def wait_ready(self, timeout: float) -> None:
        """Ask kernel_info until a kernel answers it on shell and IOPub (as jupyter_client does)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            msg_id = self.send("kernel_info_request", {})
            replied = on_iopub = False
            asked_until = min(end, time.monotonic() + 1.0)
            while not (replied and on_iopub):
                msg = await self.recv(asked_until)
                if msg is None:
                    break
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "kernel_info_reply" and msg["content"].get("status") == "ok":
                    replied = True
                elif msg["msg_type"] == "status":
                    on_iopub = True
            if replied and on_iopub:
                await self.note_kernel()
                return
        raise TimeoutError(f"no lab kernel answered kernel_info within {timeout} s")

    async def note_kernel(self) -> None:
        self.soak.watch.note_descendants()

    async def execute(self, code: str, until: float) -> tuple[dict[str, Any] | None, list[dict[str, Any]], bool]:
        """(reply, outputs, restarted): restarted when the server said the kernel restarts."""
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}  # fmt: skip
        msg_id = self.send("execute_request", content)
        outputs: list[dict[str, Any]] = []
        reply: dict[str, Any] | None = None
        idle = False
        while not (idle and reply):
            msg = await self.recv(until)
            if msg is None:
                raise TimeoutError(code)
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "dead":
                outputs.append({"msg_type": RESTARTED, "content": {"text": "dead"}})
                self.dead = True
                return reply, outputs, True
            if msg["msg_type"] == "status" and msg["content"].get("execution_state") in ("restarting", "starting"):
                outputs.append({"msg_type": RESTARTED, "content": {"text": msg["content"]["execution_state"]}})
                self.replaced = True
                return reply, outputs, True
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_reply":
                reply = msg
            elif msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
            elif msg["msg_type"] != "execute_input":
                outputs.append(msg)
        said = tracebacks(outputs) + json.dumps(reply.get("content", {}))
        self.replaced = self.replaced or any(s in said for s in (ENDED, STARTING_FRESH))
        return reply, outputs, False

    async def call(self, kind: str) -> str:
        until = time.monotonic() + self.soak.settings.call_timeout_s
        self.replaced = self.dead = False
        outcome = await self._call(kind, until)
        if self.dead:
            # A crash after crashes in a row (restart_limit, stable_start_time): jupyter_server gives up and
            # drops the kernel, as documented. A person starts another; so does the soak, and counts it.
            self.soak.verdict.notes.append(f"{self.name}: jupyter_server declared its kernel dead ({kind}); a new one")
            self.ws.close()
            self.ws = None
            await self.start()
        elif self.replaced:  # the cell's kernel was replaced in place: wait for the fresh one, as a frontend does
            await self.wait_ready(until - time.monotonic())
        return outcome

    async def _call(self, kind: str, until: float) -> str:
        n = self.soak.settings
        self.n += 1
        if kind == "run":
            reply, outputs, _ = await self.execute(RUN, until)
            return ok(stdout(outputs) == "499500\n", seen(reply, outputs))
        if kind == "large_output":
            reply, outputs, _ = await self.execute(LARGE, until)
            return ok(stdout(outputs).startswith("x" * 1_000_000), seen(reply, outputs))
        if kind == "deadline_interrupted":
            reply, outputs, _ = await self.execute(SLEEP.format(s=n.deadline_ms / 1000 + 5), until)
            return ok(f"interrupted: exceeded deadline_ms={n.deadline_ms}" in tracebacks(outputs), seen(reply, outputs))
        if kind == "deadline_killed":
            await self.note_kernel()
            reply, outputs, _ = await self.execute(IGNORES_SIGINT, until)  # the kernel is replaced in place
            return ok(f"{ENDED} (timeout" in tracebacks(outputs), seen(reply, outputs))
        if kind == "memory_error":
            reply, outputs, _ = await self.execute(TOO_BIG.format(n=2 * n.memory_limit_bytes), until)
            return ok("MemoryError" in tracebacks(outputs), seen(reply, outputs))
        if kind == "crash":
            await self.note_kernel()
            reply, outputs, restarted = await self.execute(CRASH, until)
            if self.dead:
                return "ok"  # it crashed, and too often for Jupyter's restarter: call() starts a new kernel
            if not restarted and reply is None:
                model = await self.rest("GET", f"/api/kernels/{self.kernel_id}")
                restarted = model.get("execution_state") in ("restarting", "starting")
            await self.wait_ready(until - time.monotonic())
            return ok(restarted or ENDED in tracebacks(outputs), seen(reply, outputs))
        if kind == "interrupt":
            execution = asyncio.create_task(self.execute(SLEEP.format(s=n.deadline_ms / 1000 - 0.5), until))
            await asyncio.sleep(self.rng.uniform(0.2, 0.8))  # the workload: the person presses the button
            await self.rest("POST", f"/api/kernels/{self.kernel_id}/interrupt")
            reply, outputs, _ = await execution
            said = tracebacks(outputs) + json.dumps((reply or {}).get("content", {}))
            return ok("KeyboardInterrupt" in said or reply is not None, seen(reply, outputs))
        if kind == "restart":
            await self.note_kernel()
            await self.execute("kept = 1", until)
            await self.rest("POST", f"/api/kernels/{self.kernel_id}/restart")
            await self.wait_ready(until - time.monotonic())
            reply, outputs, _ = await self.execute("print('fresh', 'kept' in dir())", until)
            return ok(stdout(outputs) == "fresh False\n", seen(reply, outputs))
        if kind == "broker":
            q = f"{self.name}-{self.n}"
            reply, outputs, _ = await self.execute(BROKER.format(q=q), until)
            hits = self.soak.hits.count("127.0.0.1", f"/api/echo?q={q}")
            good = stdout(outputs).startswith(f"200 /api/echo?q={q}\n") and hits == 1
            return ok(good, f"{hits} hits; {seen(reply, outputs)}")
        raise ValueError(kind)


def seen(reply: dict[str, Any] | None, outputs: list[dict[str, Any]]) -> str:
    """What a lab call got, short: the reply's status, then each output's type and text."""
    said = [f"reply {(reply or {}).get('content', {}).get('status')}"]
    for o in outputs:
        c = o.get("content", {})
        text = c.get("text") or "|".join(c.get("traceback", [])) or c.get("execution_state") or ""
        said.append(f"{o['msg_type']}: {str(text)[:120]}")
    return "; ".join(said)


def stdout(outputs: list[dict[str, Any]]) -> str:
    return "".join(o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream")


def tracebacks(outputs: list[dict[str, Any]]) -> str:
    said = [
        "\n".join(o["content"].get("traceback", [])) + o["content"].get("ename", "")
        for o in outputs
        if o["msg_type"] == "error"
    ]
    return "\n".join(said)


# --- the soak ------------------------------------------------------------------------------------


class Soak:
    def __init__(self, settings: Settings, base: Path) -> None:
        self.settings, self.base = settings, base
        self.t0 = time.monotonic()
        self.watch = Watch(self.t0)
        self.verdict = Verdict()
        self.hits: HitServer
        self.stop_at = 0.0

    async def drive(self, name: str, driver: AgentDriver | LabDriver, kinds: dict[str, float]) -> None:
        rng = driver.rng
        kinds = {k: w for k, w in kinds.items() if not self.settings.kinds or k in self.settings.kinds}
        names, weights = list(kinds), list(kinds.values())
        if not names:
            return
        deck = rng.sample(names, len(names))  # every kind once, in a random order, then at random
        while time.monotonic() < self.stop_at:
            kind = deck.pop() if deck else rng.choices(names, weights)[0]
            start = time.monotonic()
            try:
                outcome = await asyncio.wait_for(driver.call(kind), self.settings.call_timeout_s)
            except TimeoutError:
                outcome = "hang"
            except Exception as exc:
                outcome = f"raised {type(exc).__name__}: {str(exc)[:300]}"
            seconds = time.monotonic() - start
            if kind not in DEADLINE_KINDS and outcome != "ok" and any(m in outcome for m in CUT_MARKS):
                outcome = f"cut: {outcome}"  # slow (a loaded machine): the deadline did its job
            self.verdict.calls.append(Call(name, kind, start - self.t0, seconds, outcome))
            if isinstance(driver, AgentDriver):
                driver.note()
            if outcome == "hang":
                self.verdict.failures.append(f"hang: {name}'s {kind} call took over {self.settings.call_timeout_s} s")
                return  # this driver's kernel is in an unknown state: the others go on

    async def sampler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.verdict.samples.append(self.watch.sample())
            self.watch.note_descendants()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.sample_s)

    async def run(self) -> Verdict:
        from leftovers import ivralo_folders, owner_of
        from servers import jupyter_server_process

        from ivralo_kernel.cli.install import install

        st, v = self.settings, self.verdict
        master = random.Random(st.seed)
        folders_before = set(ivralo_folders())
        fds_start = self.watch.me.num_fds()
        threads_start = self.watch.me.num_threads()
        key = f"sk-soak-{uuid.uuid4().hex}"
        self.hits = HitServer(("127.0.0.1", *EGRESS_HOSTS), key)
        config_home = self.base / "config-home"
        config_home.mkdir()
        api = {"operations": {"soak.echo": {
            "url": f"http://127.0.0.1:{self.hits.port}/api/echo", "credential": API_KEY_NAME,
            "auth": {"kind": "bearer"}, "params": {"q": {"type": "string", "required": True}},
        }}}  # fmt: skip
        (config_home / "apis.json").write_text(json.dumps(api), encoding="utf-8")
        saved_env = {k: os.environ.get(k) for k in ("IVRALO_CONFIG_HOME", API_KEY_NAME)}
        os.environ["IVRALO_CONFIG_HOME"], os.environ[API_KEY_NAME] = str(config_home), key
        root = self.base / "lab-root"
        root.mkdir()
        install(
            prefix=str(Path(os.environ["JUPYTER_PATH"]).parents[1]),
            name=LAB_SPEC,
            display_name="Python (ivralo, soak)",
            provisioner_config={
                "deadline_ms": st.deadline_ms,
                "interrupt_grace_ms": st.grace_ms,
                "memory_limit_bytes": st.memory_limit_bytes,
                "grants": ["soak"],
                "workspace": str(root),  # else the server's working folder
            },
        )
        agents = [AgentDriver(f"s{i}", self, random.Random(master.random())) for i in range(st.sessions)]
        labs: list[LabDriver] = []
        stop = asyncio.Event()
        sampling = asyncio.create_task(self.sampler(stop))
        server_pid = None
        token = uuid.uuid4().hex
        try:
            with contextlib.ExitStack() as stack:
                if st.lab_kernels:
                    url, proc = stack.enter_context(jupyter_server_process("jupyter_server", root, token))
                    server_pid = proc.pid
                    self.watch.server = psutil.Process(proc.pid)
                    self.watch.note_pid(proc.pid)
                    for i in range(st.lab_kernels):
                        lab = LabDriver(f"lab{i}", self, random.Random(master.random()), url, token)
                        labs.append(lab)
                        await lab.start()
                # Warm-up: each session's first kernel and table (pandas, pyarrow imported), then the baseline.
                for agent in agents:
                    for kind in ("run", "table", "broker"):
                        outcome = await asyncio.wait_for(agent.call(kind), st.call_timeout_s)
                        if outcome != "ok":
                            v.failures.append(f"warm-up: {agent.name}'s {kind}: {outcome}")
                    agent.note()
                baseline = self.watch.sample()
                v.notes.append(f"after the warm-up: host RSS {baseline['rss_mb']:.0f} MB, {baseline['fds']:.0f} fds")
                self.stop_at = time.monotonic() + 60 * st.minutes
                drivers = [self.drive(a.name, a, SESSION_KINDS) for a in agents]
                drivers += [self.drive(lab.name, lab, LAB_KINDS) for lab in labs]
                await asyncio.gather(*drivers)
                self.watch.note_descendants()
                for agent in agents:
                    await asyncio.wait_for(agent.session.close(), 60)
                for lab in labs:
                    await lab.close()
        finally:
            stop.set()
            await sampling
            self.hits.close()
            for k, old in saved_env.items():
                if old is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = old
        # The end: every process seen gone, no folder of this run left, fds back, RSS bounded.
        end = time.monotonic() + 10
        while (alive := self.watch.still_running()) and time.monotonic() < end:
            await asyncio.sleep(0.1)
        for line in alive:
            v.failures.append(f"process left running: {line}")
        ours = {os.getpid(), *([server_pid] if server_pid else []), *(pid for pid, _ in self.watch.seen)}
        for folder in sorted(set(ivralo_folders()) - folders_before):
            if owner_of(folder) in ours:
                v.failures.append(f"folder left: {folder} (its stamp names pid {owner_of(folder)})")
        fds_end, threads_end = self.watch.me.num_fds(), self.watch.me.num_threads()
        v.notes.append(f"host fds {fds_start} at the start, {fds_end} at the end (bound: +{st.fd_slack})")
        v.notes.append(f"host threads {threads_start} at the start, {threads_end} at the end")
        if fds_end > fds_start + st.fd_slack:
            v.failures.append(f"fds: the host holds {fds_end} fds at the end, {fds_start} at the start")
        peak = max((s["rss_mb"] for s in v.samples if s["t"] >= baseline["t"]), default=baseline["rss_mb"])
        v.notes.append(f"host RSS {baseline['rss_mb']:.0f} MB after the warm-up, peak {peak:.0f} MB")
        if peak > baseline["rss_mb"] + st.rss_bound_mb:
            v.failures.append(
                f"RSS: the host grew from {baseline['rss_mb']:.0f} MB to {peak:.0f} MB "
                f"(bound: +{st.rss_bound_mb:.0f} MB, --rss-bound-mb)"
            )
        v.notes.append(f"processes seen (by pid): {len(self.watch.seen)}; egress hits: {len(self.hits.hits)}")
        for call in v.calls:
            if call.outcome in ("ok", "hang") or call.outcome.startswith("cut: "):
                continue
            what = f"{call.driver}'s {call.kind} at {call.start:.0f} s: {call.outcome}"
            if any(t in call.outcome for t in st.tolerate):
                v.tolerated.append(what)
            else:
                v.failures.append(what)
        cut = [c for c in v.calls if c.outcome.startswith("cut: ")]
        if cut:
            v.notes.append(f"cut by the deadline (slow on this machine, not failed): {len(cut)} calls")
        half = [x["rss_mb"] for x in v.samples if x["t"] >= baseline["t"] + 30 * st.minutes]
        if half:
            v.notes.append(f"host RSS at half-time {half[0]:.0f} MB, at the end of the calls {half[-1]:.0f} MB")
        if v.tolerated:
            v.notes.append(f"tolerated (--tolerate, a known bug): {len(v.tolerated)} calls, listed below")
        return v


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(settings: Settings, v: Verdict) -> str:
    lines = [
        f"Soak: {settings.sessions} sessions + {settings.lab_kernels} lab kernel(s), {settings.minutes:g} min, "
        f"seed {settings.seed}: **{'FAIL' if v.failures else 'pass'}** ({len(v.calls)} calls)",
        "",
        "| where | kind | calls | p50 (ms) | p99 (ms) | cut by the deadline | not ok |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[Call]] = {}
    for c in v.calls:
        groups.setdefault(("lab" if c.driver.startswith("lab") else "session", c.kind), []).append(c)
    for (where, kind), calls in sorted(groups.items()):
        ms = [1000 * c.seconds for c in calls]
        cut = sum(1 for c in calls if c.outcome.startswith("cut: "))
        bad = sum(1 for c in calls if c.outcome != "ok") - cut
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        lines.append(f"| {where} | {kind} | {len(calls)} | {p50:.0f} | {p99:.0f} | {cut} | {bad} |")
    lines += ["", *[f"- {n}" for n in v.notes]]
    if v.failures:
        lines += ["", "Failures:", *[f"- {f}" for f in v.failures[:50]]]
    if v.tolerated:
        lines += ["", "Tolerated:", *[f"- {f}" for f in v.tolerated[:50]]]
    cut = [
        f"- {c.driver}'s {c.kind} at {c.start:.0f} s: {c.outcome[5:205]}" for c in v.calls if c.outcome[:4] == "cut:"
    ]
    if cut:
        lines += ["", "Cut by the deadline:", *cut[:50]]
    return "\n".join(lines) + "\n"


def plot(samples: list[dict[str, float]], out: Path) -> Path:
    """soak.png with matplotlib when importable, else soak.svg drawn by hand."""
    series = [("rss_mb", "host RSS (MB)"), ("fds", "host open fds"), ("threads", "host threads")]
    t = [s["t"] for s in samples]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg(samples, series, out / "soak.svg")
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 7), sharex=True)
    for ax, (key, label) in zip(axes, series, strict=True):
        ax.plot(t, [s[key] for s in samples], label="soak host")
        server = [s.get(f"server_{key}") for s in samples]
        if any(x is not None for x in server):
            ax.plot(t, [x if x is not None else float("nan") for x in server], label="jupyter_server")
        ax.set_ylabel(label)
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("seconds")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _svg(samples: list[dict[str, float]], series: list[tuple[str, str]], path: Path) -> Path:
    w, h, pad = 800, 200, 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * len(series)}">']
    t = [s["t"] for s in samples] or [0.0]
    for i, (key, label) in enumerate(series):
        ys = [s[key] for s in samples] or [0.0]
        lo, hi, t1 = min(ys), max(ys) or 1.0, max(t) or 1.0
        pts = " ".join(
            f"{pad + (w - 2 * pad) * x / t1:.1f},{i * h + h - pad - (h - 2 * pad) * (y - lo) / ((hi - lo) or 1):.1f}"
            for x, y in zip(t, ys, strict=True)
        )
        parts.append(f'<text x="{pad}" y="{i * h + 20}">{label}: {lo:.0f} to {hi:.0f}</text>')
        parts.append(f'<polyline fill="none" stroke="blue" points="{pts}"/>')
    parts.append("</svg>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def write_results(settings: Settings, v: Verdict) -> Path:
    out = settings.results_dir / (datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-soak")
    out.mkdir(parents=True, exist_ok=True)
    v.summary = summarize(settings, v)
    record = {
        "settings": {k: str(x) if isinstance(x, Path) else x for k, x in asdict(settings).items()},
        "failures": v.failures,
        "tolerated": v.tolerated,
        "notes": v.notes,
        "calls": [asdict(c) for c in v.calls],
        "samples": v.samples,
    }
    (out / "results.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    if v.server_log:
        (out / "jupyter_server.log").write_text(v.server_log, encoding="utf-8")
    figure = plot(v.samples, out)
    (out / "summary.md").write_text(v.summary + f"\nPlot: {figure.name}\n", encoding="utf-8")
    v.out_dir = out
    return out


async def run_soak(settings: Settings) -> Verdict:
    """The soak in this process (the caller has isolated Jupyter's folders and set JUPYTER_PATH)."""
    for folder in (str(BENCH_DIR), str(TESTS_DIR)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        verdict = await Soak(settings, Path(tmp)).run()
        for log in Path(tmp).glob("*jupyter_server.log"):
            verdict.server_log = log.read_text(encoding="utf-8", errors="replace")[-4_000_000:]
    write_results(settings, verdict)
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Settings()
    parser.add_argument("--sessions", type=int, default=d.sessions)
    parser.add_argument("--lab-kernels", type=int, default=d.lab_kernels)
    parser.add_argument("--minutes", type=float, default=d.minutes)
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--call-timeout", type=float, default=d.call_timeout_s, help="seconds; longer is a hang")
    parser.add_argument("--rss-bound-mb", type=float, default=d.rss_bound_mb)
    parser.add_argument("--fd-slack", type=int, default=d.fd_slack)
    parser.add_argument("--results-dir", type=Path, default=d.results_dir)
    parser.add_argument("--tolerate", action="append", default=[], help="an outcome text not to fail on")
    parser.add_argument("--kinds", default="", help="comma-separated: only these kinds of call (default: all)")
    args = parser.parse_args(argv)
    settings = Settings(
        sessions=args.sessions, lab_kernels=args.lab_kernels, minutes=args.minutes, seed=args.seed,
        call_timeout_s=args.call_timeout, rss_bound_mb=args.rss_bound_mb, fd_slack=args.fd_slack,
        results_dir=args.results_dir, kinds=tuple(k for k in args.kinds.split(",") if k), tolerate=tuple(args.tolerate),
    )  # fmt: skip
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans stay ours, to be seen
    sys.path.insert(0, str(BENCH_DIR))
    from startup_latency import isolate_jupyter

    with tempfile.TemporaryDirectory(prefix="soak-jupyter-") as tmp:
        isolate_jupyter(Path(tmp))
        for var, sub in (("IVRALO_CONFIG_HOME", "ivralo-config"), ("MPLCONFIGDIR", "mpl")):
            (Path(tmp) / sub).mkdir()
            os.environ[var] = str(Path(tmp) / sub)
        verdict = asyncio.run(run_soak(settings))
    print(verdict.summary)
    print(f"results: {verdict.out_dir}")
    if verdict.failures:
        print(f"soak FAILED: {len(verdict.failures)} reason(s), the first: {verdict.failures[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
