"""[kernel] One call to the host from a cell, and its answer turned into a result or an error.

``ivralo.call``/``sql``/``operations`` (``api``) and ``%apropos``/``%doc`` (``surface_magics``) both
ask the host through here: ``surface_magics`` needs nothing of ``api``, which uses it.
"""

from __future__ import annotations

from typing import Any

from ivralo_kernel.kernel.broker_client import BROKER, BrokerUnavailable

# The host bounds each call itself (an operation's timeout, a database's); this only ends a wait
# for a host that went away.
ANSWER_TIMEOUT_S = 300.0
CATALOG_TIMEOUT_S = 10.0


class BrokerError(RuntimeError):
    """The host could not make the call (it failed, or no ivralo host is attached)."""

    __module__ = "ivralo_kernel.kernel.api"  # its public home (``ivralo.BrokerError``), as tracebacks name it


class BrokerRefused(BrokerError, PermissionError):
    """The host will not make this call: no grant for it, an unknown name, or bad parameters."""

    __module__ = "ivralo_kernel.kernel.api"


def ask(kind: str, payload: dict[str, Any], timeout: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
    """Ask the host (``kind``, ``payload``) and wait up to ``timeout`` seconds: the answer's result, or
    ``BrokerRefused``/``BrokerError`` saying why there is none."""
    __tracebackhide__ = True  # IPython shows the user's line and the error, not this module's frames
    try:
        answer = BROKER.ask(kind, payload, timeout)
    except BrokerUnavailable as exc:
        raise BrokerError(str(exc)) from None
    except TimeoutError as exc:
        raise BrokerError(f"{exc}; the host may have stopped: restart the kernel") from None
    if isinstance(answer.get("record"), dict):
        BROKER.records.append(answer["record"])
    if not answer.get("ok"):
        reason = str(answer.get("error") or answer.get("reason") or "refused by the host")
        if answer.get("refused"):
            raise BrokerRefused(reason)
        raise BrokerError(reason)
    result = answer.get("result")
    return result if isinstance(result, dict) else {}
