"""[kernel] ``IvraloKernelApp``: ipykernel's application with the two changes the ivralo kernel needs.

* Input history stays in memory. IPython's sqlite file lives outside the workspace, where writes are
  refused once the kernel runs. nbclient, papermill and ``nbconvert --execute`` pass their own
  ``--HistoryManager.hist_file`` for kernels named ``python3``; given twice, traitlets makes the
  setting a list and the kernel dies at start, so a client's value is replaced, not repeated.
* IOPub reports every subscriber (``XPUB_VERBOSE``). ipykernel sends ``iopub_welcome`` when its XPUB
  reports a subscription, and a plain XPUB reports only the first subscriber of a topic: the host's
  watchdog subscribes first, and a client would never get its welcome (nor the watchdog, when a
  client was first: the watchdog needs its welcome to know it is heard).
* The host's watchdog's subscriptions to its own topics (after its welcome for everything) get no
  welcome: each would reach every client subscribed to everything (protocol/iopub_topics.py).
* Its log lines carry ipykernel's prefix (``[IPKernelApp] WARNING | ...``): clients recognise
  ipykernel's known start-up lines by it (nbclient passes over the unencrypted-TCP warning).
"""

from __future__ import annotations

from typing import Any

import zmq
from ipykernel.kernelapp import IPKernelApp
from traitlets import default

from ivralo_kernel import compat
from ivralo_kernel.protocol.iopub_topics import watchdog_topics

HISTORY_IN_MEMORY = "--HistoryManager.hist_file=:memory:"
_HISTORY_FLAG = "--HistoryManager.hist_file"


def without_history_file(argv: list[str]) -> list[str]:
    """``argv`` with every ``--HistoryManager.hist_file`` setting (``=value`` or ``value`` form) removed."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        if arg == _HISTORY_FLAG:
            skip_value = True
            continue
        if arg.startswith(_HISTORY_FLAG + "="):
            continue
        kept.append(arg)
    return kept


class IvraloKernelApp(compat.KernelAppOverrides, IPKernelApp):  # type: ignore[misc]
    @default("log_format")
    def _log_format_default(self) -> str:
        # traitlets names the logger after the class: "[IvraloKernelApp]" is a prefix no client knows.
        return "[IPKernelApp]%(highlevel)s %(message)s"

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize([*without_history_file(list(argv or [])), HISTORY_IN_MEMORY])

    def before_bind(self, socket: Any) -> None:
        # (ipykernel's _bind_socket, through compat.KernelAppOverrides) IOPub's XPUB, before any
        # subscriber can connect.
        if socket.type == zmq.XPUB:
            socket.setsockopt(zmq.XPUB_VERBOSE, 1)

    def init_iopub(self, context: Any) -> None:
        super().init_iopub(context)
        session = self.session

        def the_watchdogs(subscription: str) -> bool:
            return subscription.encode() in watchdog_topics(session.key)

        compat.quiet_welcomes(self.iopub_thread, the_watchdogs)
