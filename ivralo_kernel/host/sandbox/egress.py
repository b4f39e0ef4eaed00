"""[host] The egress policy as the host applies it (the file format lives in ``protocol.egress``):
judging a host, asking about an unknown one, and recording "always".

Who is asked about an unknown host: an agent's ``ask`` callback (called here, on its own thread),
or else the person at the notebook or console, at the running cell's input prompt, asked by the
host itself through its channel relay (``person``): the question and the answer never pass through
the kernel, so code there can neither answer for the person nor write an "always". Nobody to ask
(nbclient, a client that did not allow stdin, a kernel without the OS sandbox and so without the
relay, a raw launch): refused.

Questions come two ways: from the kernel's network guard (``judge``, a broker request) and from the
egress proxy of a sandboxed kernel (``decide``, blocking on the proxy's connection thread: curl in a
subprocess asks too). One question per host is open at a time; whoever else wants the same host
waits for that answer.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ivralo_kernel.host.sandbox.person_question import ask_until_chosen
from ivralo_kernel.host.settings.workspace_files import PERMISSIONS, WorkspaceFiles, stamp
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.credentials import config_home
from ivralo_kernel.protocol.messages import BrokerAnswer
from ivralo_kernel.protocol.network.egress import (
    ALWAYS_RECORDED,
    PERMISSIONS_FILE,
    UNTIL_RESTART,
    EgressPolicy,
    load_egress_policy,
)
from ivralo_kernel.protocol.network.egress_names import HostNameError, Target, normalize
from ivralo_kernel.protocol.terminal import terminal_safe

__all__ = ["Asker", "EgressDesk", "EgressPolicy", "allow_always", "load_egress_policy"]

# ask(question, choices) -> one of the choices; may block (it runs on its own thread).
Asker = Callable[[str, tuple[str, ...]], str]
Reply = Callable[[BrokerAnswer], None]
Pause = Callable[[bool], None]
# (execution, prompt text) -> what the person typed there; None: nobody can answer. The host's own
# channel to the client (ChannelRelay.ask), never the kernel's.
PersonAsk = Callable[[str, str], str | None]
Decision = tuple[bool, str]
PERSON_ANSWER_TIMEOUT_S = 600.0  # as the kernel's own wait (egress_judge.EGRESS_ANSWER_TIMEOUT_S)
NOBODY_TO_ASK = "nobody to ask"  # no agent callback, no client input prompt the host can ask at
RELAYED_ANSWER = "an answer sent from the kernel counts for nothing: the host asks the person itself"
log = logging.getLogger(__name__)


CELL_QUESTION = "Code in this cell wants to reach {meant}"
AGENT_QUESTION = "Code in run_python wants to reach {meant}"
# In a folder that is not trusted only yes and no are offered: the question says what offers "always".
ALWAYS_NEEDS_TRUST = ' ("always" needs a trusted folder: ivralo-kernel trust {path})'


def untrusted_note(workspace: str) -> str:
    """What the question in an untrusted folder adds: how to have "always" offered there."""
    return ALWAYS_NEEDS_TRUST.format(path=terminal_safe(shlex.quote(workspace)))


def cell_question(host: str, port: int | None, wording: str = CELL_QUESTION) -> str:
    """The question about ``host:port``, as a person reads it at the cell's input prompt (the README's
    screenshot shows it) or an agent's ``ask`` gets it: what the name means, where that is, how the
    code wrote it, and the port ("127.0.0.1, this machine, written as 2130706433, port 5432")."""
    try:
        meant = normalize(host).describe(port)
    except HostNameError:  # never asked about (refused first); shown escaped all the same
        meant = terminal_safe(host) + (f", port {port}" if port is not None else "")
    return wording.format(meant=meant)


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
    # Whole or not at all: a proxy thread judging another request reads the file meanwhile.
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, path)
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
        self.person: PersonAsk | None = None  # the host's own way to the person (the provisioner's relay)
        self._granted: dict[str, bool] = {}  # answers given for this worker's life
        self._open: dict[str, Future[Decision]] = {}  # host -> the proxy's open question about it
        self._lock = threading.Lock()
        self._policy: tuple[object, EgressPolicy] | None = None  # (the files' stamps, their policy)

    def policy(self) -> EgressPolicy:
        """The allow list as the files say now. Read again only when a file's stamp moved (the proxy
        judges every request: parsing both files each time was a tenth of a proxied request)."""
        usable = self.files is None or self.files.usable(PERMISSIONS)
        paths = [Path(self.workspace) / names.STATE_DIR / PERMISSIONS_FILE] if usable else []
        paths.append(config_home(os.environ) / PERMISSIONS_FILE)
        stamps = tuple((str(path), stamp(path)) for path in paths)  # before the read: a later change moves them
        cached = self._policy
        if cached is not None and cached[0] == stamps:
            return cached[1]
        policy = load_egress_policy(self.workspace, os.environ, include_workspace=usable)
        if all(seen is not False for _, seen in stamps):
            self._policy = (stamps, policy)
        return policy

    @property
    def choices(self) -> tuple[str, ...]:
        return names.EGRESS_CHOICES if self.trusted else ("yes", "no")

    def question(self, host: str, port: int | None, wording: str) -> str:
        """The question about ``host:port``; in a folder that is not trusted, with how to have "always"."""
        asked = cell_question(host, port, wording)
        return asked if self.trusted else asked + untrusted_note(self.workspace)

    def _earlier(self, key: str) -> str:
        """The reason of an answer given earlier: a yes lasts until this kernel restarts."""
        return UNTIL_RESTART if self._granted[key] else "answered earlier"

    def judge(self, payload: dict[str, Any], execution: str, reply: Reply, pause: Pause) -> None:
        """(the watchdog's thread) The kernel's network guard asks (outside the OS sandbox; inside,
        only code forging a request does): the same questions as the proxy's, one open per host."""
        host, port = payload["host"], payload["port"]
        allowed, reason = self.policy().judge(host, port)
        key = grant_key(normalize(host), port)
        if allowed is not None:
            reply({"allowed": allowed, "reason": reason})
        elif key in self._granted:
            reply({"allowed": self._granted[key], "reason": self._earlier(key)})
        elif self.asker is None and self.person is None:
            reply({"allowed": False, "reason": NOBODY_TO_ASK})
        else:

            def ask() -> None:
                allowed, reason = self._asked(host, port, execution, self.person, pause)
                reply({"allowed": allowed, "reason": reason})

            threading.Thread(target=ask, name="ivralo-ask", daemon=True).start()

    def allowed_hosts(self) -> list[str]:
        """What code here may reach without being asked: hosts.allow's entries (host, or host:port),
        and the hosts a person said yes to, until this kernel restarts."""
        policy = self.policy()
        listed = [e.host if e.port is None else f"{e.host}:{e.port}" for e in policy.allow] if not policy.closed else []
        return [*listed, *(f"{host} ({UNTIL_RESTART})" for host, yes in self._granted.items() if yes)]

    def decide(self, host: str, port: int, execution: str | None, person: PersonAsk | None, pause: Pause) -> Decision:
        """(the egress proxy's thread; blocks) Judge ``host:port`` for a sandboxed kernel's traffic;
        ``person``: the host's way to ask at ``execution``'s input prompt, if it has one."""
        try:
            normalize(host)
        except HostNameError as exc:
            return False, str(exc)
        allowed, reason = self.policy().judge(host, port)
        if allowed is not None:
            return allowed, reason
        return self._asked(host, port, execution, person, pause)

    def _asked(
        self, host: str, port: int | None, execution: str | None, person: PersonAsk | None, pause: Pause
    ) -> Decision:
        """(blocks) The answer about ``host``: asked now, or the answer to the question already open
        about it (a cell's Python and its curl, or a guard's question, wait for the same one). Keyed
        by what the name means (``grant_key``): every spelling of one place is one question."""
        key = grant_key(normalize(host), port)
        with self._lock:
            if key in self._granted:
                return self._granted[key], self._earlier(key)
            question = self._open.get(key)
            mine = question is None or question.done()
            if mine:
                # An "always" answered since this caller's first look is in permissions.json now
                # (written before that question's answer was set): judge again before asking anew.
                allowed, reason = self.policy().judge(host, port)
                if allowed is not None:
                    return allowed, reason
                question = self._open[key] = Future()
        assert question is not None
        if mine:
            self._ask(host, port, execution, person, pause, question)
        try:
            return question.result(timeout=PERSON_ANSWER_TIMEOUT_S + 5)
        except TimeoutError:
            return False, "nobody answered in time"
        finally:
            with self._lock:
                if self._open.get(key) is question and question.done():
                    del self._open[key]

    def _ask(
        self,
        host: str,
        port: int | None,
        execution: str | None,
        person: PersonAsk | None,
        pause: Pause,
        question: Future[Decision],
    ) -> None:
        box: list[BrokerAnswer] = []
        try:
            if self.asker is not None:
                self._ask_agent(self.asker, host, port, box.append, pause)
            elif execution is None or person is None:
                box.append({"allowed": False, "reason": NOBODY_TO_ASK})
            else:
                box.append(self._ask_person(person, host, port, execution, pause))
        finally:  # whoever else waits for this host gets the same answer, or a no
            answer = box[0] if box else BrokerAnswer(allowed=False, reason="the host could not ask")
            question.set_result((bool(answer["allowed"]), str(answer["reason"])))

    def _ask_person(self, person: PersonAsk, host: str, port: int | None, execution: str, pause: Pause) -> BrokerAnswer:
        """Ask at the cell's input prompt, through the host's own channel: only what the host itself
        received there is an answer (an "always" is written only then)."""
        pause(True)  # the time the person takes does not count against the deadline
        try:
            question = self.question(host, port, CELL_QUESTION)
            choice = ask_until_chosen(lambda text: person(execution, text), question, self.choices)
        except Exception as exc:  # noqa: BLE001 - a failing prompt is a "no", never a hang
            log.warning("ivralo: asking the person failed (%s); refusing %s", terminal_safe(str(exc)), host)
            choice = "no"
        finally:
            pause(False)
        if choice is None:
            return {"allowed": False, "reason": NOBODY_TO_ASK}
        return self._record(host, port, choice)

    def _ask_agent(self, asker: Asker, host: str, port: int | None, reply: Reply, pause: Pause) -> None:
        pause(True)  # the time the person takes does not count against the deadline
        try:
            choice = asker(self.question(host, port, AGENT_QUESTION), self.choices)
        except Exception as exc:  # noqa: BLE001 - a failing callback is a "no", never a hang
            log.warning("ivralo: the ask callback failed (%s); refusing %s", terminal_safe(str(exc)), host)
            choice = "no"
        finally:
            pause(False)
        reply(self._record(host, port, choice))

    def _record(self, host: str, port: int | None, choice: str) -> BrokerAnswer:
        key = grant_key(normalize(host), port)
        if choice == "always" and self.trusted:
            if self.files is None:
                allow_always(self.workspace, key)
            else:
                with self.files.host_writes(PERMISSIONS):
                    allow_always(self.workspace, key)
            return {"allowed": True, "reason": ALWAYS_RECORDED}
        if choice in ("yes", "always"):
            self._granted[key] = True
            return {"allowed": True, "reason": UNTIL_RESTART}
        self._granted[key] = False
        return {"allowed": False, "reason": "the person said no"}
