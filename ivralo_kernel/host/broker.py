"""[host] Answer what a kernel asks over the broker comm: today, egress questions.

Every request is untrusted (user code can read the kernel's HMAC key and forge messages): it must
come from a live execution (its parent is an execute_request the watchdog saw start and not end),
it is validated against its kind's schema, and each execution gets a bounded number of them.
Unknown hosts are asked about, when somebody can answer (an agent's ``ask`` callback); otherwise
they are refused. "always" is recorded in the workspace's permissions.json, in a trusted folder only.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from ivralo_kernel.host.egress import allow_always
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.egress import load_egress_policy

# ask(question, choices) -> one of the choices; may block (it runs on its own thread).
Asker = Callable[[str, tuple[str, ...]], str]
REQUESTS_PER_EXECUTION = 200

log = logging.getLogger(__name__)


def _valid_egress(payload: Any) -> tuple[str, int | None] | None:
    if not isinstance(payload, dict):
        return None
    host, port = payload.get("host"), payload.get("port")
    if not isinstance(host, str) or not 0 < len(host) <= 253 or any(c.isspace() for c in host):
        return None
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536):
        return None
    return host.lower().rstrip("."), port


class BrokerResponder:
    def __init__(self, workspace: str, trusted: bool, asker: Asker | None = None) -> None:
        self.workspace, self.trusted = workspace, trusted
        self.asker = asker
        self._granted: dict[str, bool] = {}  # answers given for this worker's life
        self._counts: dict[str, int] = {}

    def answer(
        self,
        request: Any,
        execution: str | None,
        reply: Callable[[dict[str, Any]], None],
        pause: Callable[[bool], None],
    ) -> None:
        """Reply now, or from an asking thread later (``reply`` must be thread-safe)."""
        if not isinstance(request, dict) or not isinstance(request.get("req_id"), str):
            return  # nothing to answer to
        if execution is None:
            reply({"allowed": False, "reason": "the request is not from a running execution"})
            return
        self._counts[execution] = self._counts.get(execution, 0) + 1
        if self._counts[execution] > REQUESTS_PER_EXECUTION:
            reply({"allowed": False, "reason": f"more than {REQUESTS_PER_EXECUTION} requests from one execution"})
            return
        if request.get("kind") != names.BROKER_EGRESS:
            reply({"allowed": False, "reason": f"unknown request kind {str(request.get('kind'))[:40]!r}"})
            return
        target = _valid_egress(request.get("payload"))
        if target is None:
            reply({"allowed": False, "reason": "malformed egress request"})
            return
        host, port = target
        allowed, reason = load_egress_policy(self.workspace, os.environ).judge(host, port)
        if allowed is not None:
            reply({"allowed": allowed, "reason": reason})
        elif host in self._granted:
            reply({"allowed": self._granted[host], "reason": "answered earlier"})
        elif self.asker is None:
            reply({"allowed": False, "reason": "nobody to ask"})
        else:
            asker = self.asker
            threading.Thread(target=self._ask, args=(asker, host, reply, pause), daemon=True).start()

    def _ask(
        self, asker: Asker, host: str, reply: Callable[[dict[str, Any]], None], pause: Callable[[bool], None]
    ) -> None:
        choices = ("yes", "always", "no") if self.trusted else ("yes", "no")
        pause(True)  # the time the person takes does not count against the deadline
        try:
            choice = asker(f"Code in run_python wants to reach {host}", choices)
        except Exception as exc:  # noqa: BLE001 - a failing callback is a "no", never a hang
            log.warning("ivralo: the ask callback failed (%s); refusing %s", exc, host)
            choice = "no"
        finally:
            pause(False)
        if choice == "always" and self.trusted:
            allow_always(self.workspace, host)
            reply({"allowed": True, "reason": "always (hosts.allow)"})
        elif choice in ("yes", "always"):
            self._granted[host] = True
            reply({"allowed": True, "reason": "yes this time"})
        else:
            self._granted[host] = False
            reply({"allowed": False, "reason": "the person said no"})
