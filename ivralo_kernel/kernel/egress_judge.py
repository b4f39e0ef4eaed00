"""[kernel] Who decides whether code may reach a host: the host side, over the broker.

The host judges with the allow list and, for an unknown host, asks somebody itself: an agent's
``ask`` callback, or the person at the notebook or console, at this cell's input prompt, on the
host's own channel to the client. Nothing here shows the question or sees the answer, so nothing
in this process can answer for the person. Without a host (a raw launch), the allow list alone
decides and nobody is asked.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ivralo_kernel.kernel.broker_client import BROKER, BrokerUnavailable
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.network.egress import load_egress_policy

# Asking a person may take a while; the host pauses the cell's deadline meanwhile.
EGRESS_ANSWER_TIMEOUT_S = 600.0

Decision = tuple[bool, str]


def egress_judge(workspace: str) -> Callable[[str, int | None], Decision]:
    def judge(host: str, port: int | None) -> Decision:
        try:
            answer = BROKER.ask(
                names.BROKER_EGRESS, {"host": host, "port": port}, EGRESS_ANSWER_TIMEOUT_S, pause_deadline=True
            )
        except BrokerUnavailable:
            allowed, reason = load_egress_policy(workspace, os.environ).judge(host, port)
            return (True, reason) if allowed else (False, "no ivralo host is attached to ask")
        except TimeoutError:
            return False, "the ivralo host did not answer"
        return bool(answer.get("allowed")), str(answer.get("reason") or "refused by the host")

    return judge
