"""[host] The egress policy as the host applies it (the file format lives in ``protocol.egress``):
judging a host, asking about an unknown one, and recording "always".

Who is asked about an unknown host: an agent's ``ask`` callback (called here, on its own thread),
or else the person at the notebook or console, through the running cell's input prompt: the reply
then says "ask the person", the kernel prompts, and relays the answer, which only counts for a
question this desk asked in that execution. Nobody to ask: refused.

Questions come two ways: from the kernel's network guard (``judge``, a broker request) and from the
egress proxy of a sandboxed kernel (``decide``, blocking on the proxy's connection thread: curl in a
subprocess asks too). One question per host is open at a time; whoever else wants the same host
waits for that answer.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ivralo_kernel.host.config_watch import PERMISSIONS, WorkspaceFiles
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.egress import PERMISSIONS_FILE, EgressPolicy, load_egress_policy
from ivralo_kernel.protocol.egress_names import HostNameError, Target, normalize
from ivralo_kernel.protocol.messages import BrokerAnswer, EgressPrompt
from ivralo_kernel.protocol.terminal import terminal_safe

__all__ = ["Asker", "EgressDesk", "EgressPolicy", "allow_always", "load_egress_policy"]

# ask(question, choices) -> one of the choices; may block (it runs on its own thread).
Asker = Callable[[str, tuple[str, ...]], str]
Reply = Callable[[BrokerAnswer], None]
Pause = Callable[[bool], None]
Prompt = Callable[[EgressPrompt], None]  # shows a question at the running cell's input prompt
Decision = tuple[bool, str]
PERSON_ANSWER_TIMEOUT_S = 600.0  # as the kernel's own wait (egress_judge.EGRESS_ANSWER_TIMEOUT_S)
NOBODY_TO_ASK = "nobody to ask"  # as the guard says it: no agent callback, no input prompt to show it at
log = logging.getLogger(__name__)


def cell_question(host: str, port: int | None, asker: str = "Code in this cell") -> str:
    """The question about ``host:port``, as a person reads it at the cell's input prompt (the README's
    screenshot shows it) or an agent's ``ask`` gets it: what the name means, where that is, how the
    code wrote it, and the port ("127.0.0.1, this machine, written as 2130706433, port 5432")."""
    try:
        meant = normalize(host).describe(port)
    except HostNameError:  # never asked about (refused first); shown escaped all the same
        meant = terminal_safe(host) + (f", port {port}" if port is not None else "")
    return f"{asker} wants to reach {meant}"


def grant_key(target: Target, port: int | None) -> str:
    """What a yes is for: the host, or on this machine and the person's network (where each port is
    another program: a database, another notebook) the host and that port."""
    return f"{target.host}:{port}" if target.local and port is not None else target.host


def allow_always(workspace: str, host: str) -> Path:
    """The person answered "always": record the host in the workspace's permissions.json."""
    path = Path(workspace) / names.STATE_DIR / PERMISSIONS_FILE
    data: dict[str, object] = {}
    if path.exists():
        loaded = json.loads(path.read_text(encoding="utf-8"))
        data = loaded if isinstance(loaded, dict) else {}
    hosts = data.setdefault("hosts", {})
    assert isinstance(hosts, dict)
    allow = hosts.setdefault("allow", [])
    assert isinstance(allow, list)
    if host not in allow:
        allow.append(host)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def valid_target(payload: Any) -> tuple[str, int | None] | None:
    if not isinstance(payload, dict):
        return None
    host, port = payload.get("host"), payload.get("port")
    if not isinstance(host, str):
        return None
    try:
        normalize(host)
    except HostNameError:
        return None
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536):
        return None
    return host.lower().rstrip("."), port


class EgressDesk:
    def __init__(
        self, workspace: str, trusted: bool, asker: Asker | None = None, files: WorkspaceFiles | None = None
    ) -> None:
        self.workspace, self.trusted, self.asker = workspace, trusted, asker
        self.files = files  # whether the workspace's permissions.json may be used (see config_watch)
        self._granted: dict[str, bool] = {}  # answers given for this worker's life
        self._asked_person: set[tuple[str, str]] = set()  # (execution, host) waiting for the person
        self._open: dict[str, Future[Decision]] = {}  # host -> the proxy's open question about it
        self._lock = threading.Lock()

    def policy(self) -> EgressPolicy:
        usable = self.files is None or self.files.usable(PERMISSIONS)
        return load_egress_policy(self.workspace, os.environ, include_workspace=usable)

    @property
    def choices(self) -> tuple[str, ...]:
        return names.EGRESS_CHOICES if self.trusted else ("yes", "no")

    def judge(self, payload: dict[str, Any], execution: str, reply: Reply, pause: Pause) -> None:
        host, port = payload["host"], payload["port"]
        allowed, reason = self.policy().judge(host, port)
        key = grant_key(normalize(host), port)
        if allowed is not None:
            reply({"allowed": allowed, "reason": reason})
        elif key in self._granted:
            reply({"allowed": self._granted[key], "reason": "answered earlier"})
        elif self.asker is not None:
            args = (self.asker, host, port, reply, pause)
            threading.Thread(target=self._ask_agent, args=args, name="ivralo-ask", daemon=True).start()
        elif payload.get("person") is True:
            self._asked_person.add((execution, key))
            pause(True)  # resumed when the answer comes, or when the execution ends
            question = cell_question(host, port)
            reply({"ask_person": True, "question": question, "choices": list(self.choices)})
        else:
            reply({"allowed": False, "reason": "nobody to ask"})

    def person_answered(self, payload: dict[str, Any], execution: str, reply: Reply, pause: Pause) -> None:
        host, port, choice = payload["host"], payload.get("port"), payload.get("choice")
        key = grant_key(normalize(host), port)
        if (execution, key) not in self._asked_person:
            reply({"allowed": False, "reason": "an answer to a question nobody asked"})
            return
        self._asked_person.discard((execution, key))
        pause(False)
        if payload.get("unavailable") is True:  # the cell could not show the question
            answer = BrokerAnswer(allowed=False, reason=NOBODY_TO_ASK)
        else:
            answer = self._record(host, port, choice if choice in self.choices else "no")
        with self._lock:
            question = self._open.get(key)
        if question is not None and not question.done():
            question.set_result((bool(answer["allowed"]), str(answer["reason"])))
        reply(answer)

    def allowed_hosts(self) -> list[str]:
        """What code here may reach without being asked: hosts.allow's entries (host, or host:port),
        and the hosts a person said yes to for this worker's life."""
        policy = self.policy()
        listed = [e.host if e.port is None else f"{e.host}:{e.port}" for e in policy.allow] if not policy.closed else []
        return [*listed, *(f"{host} (yes this time)" for host, yes in self._granted.items() if yes)]

    def decide(self, host: str, port: int, execution: str | None, prompt: Prompt | None, pause: Pause) -> Decision:
        """(the egress proxy's thread; blocks) Judge ``host:port`` for a sandboxed kernel's traffic."""
        try:
            key = grant_key(normalize(host), port)
        except HostNameError as exc:
            return False, str(exc)
        allowed, reason = self.policy().judge(host, port)
        if allowed is not None:
            return allowed, reason
        with self._lock:
            if key in self._granted:
                return self._granted[key], "answered earlier"
            question = self._open.get(key)
            mine = question is None or question.done()
            if mine:
                question = self._open[key] = Future()
        assert question is not None
        if mine:
            self._ask_for_proxy(host, port, execution, prompt, pause, question)
        try:
            return question.result(timeout=PERSON_ANSWER_TIMEOUT_S + 5)
        except TimeoutError:
            return False, "nobody answered in time"
        finally:
            with self._lock:
                if self._open.get(key) is question and question.done():
                    del self._open[key]

    def _ask_for_proxy(
        self,
        host: str,
        port: int,
        execution: str | None,
        prompt: Prompt | None,
        pause: Pause,
        question: Future[Decision],
    ) -> None:
        if self.asker is not None:
            box: list[BrokerAnswer] = []
            self._ask_agent(self.asker, host, port, box.append, pause)
            question.set_result((bool(box[0]["allowed"]), str(box[0]["reason"])))
        elif execution is None or prompt is None:
            question.set_result((False, NOBODY_TO_ASK))
        else:
            self._asked_person.add((execution, grant_key(normalize(host), port)))
            pause(True)  # resumed when the answer comes
            text = cell_question(host, port)
            prompt(EgressPrompt(host=host, port=port, question=text, choices=list(self.choices)))

    def _ask_agent(self, asker: Asker, host: str, port: int | None, reply: Reply, pause: Pause) -> None:
        pause(True)  # the time the person takes does not count against the deadline
        try:
            choice = asker(cell_question(host, port, "Code in run_python"), self.choices)
        except Exception as exc:  # noqa: BLE001 - a failing callback is a "no", never a hang
            log.warning("ivralo: the ask callback failed (%s); refusing %s", terminal_safe(str(exc)), host)
            choice = "no"
        finally:
            pause(False)
        reply(self._record(host, port, choice))

    def _record(self, host: str, port: int | None, choice: str) -> BrokerAnswer:
        key = grant_key(normalize(host), port)
        if choice == "always" and self.trusted:
            allow_always(self.workspace, key)
            if self.files is not None:
                self.files.host_wrote(PERMISSIONS)
            return {"allowed": True, "reason": "always (hosts.allow)"}
        if choice in ("yes", "always"):
            self._granted[key] = True
            return {"allowed": True, "reason": "yes this time"}
        self._granted[key] = False
        return {"allowed": False, "reason": "the person said no"}
