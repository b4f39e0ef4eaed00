"""[host] The static code gate, before a worker is contacted: denied code never starts one.

The rules are the settings' (``code_gate`` and its lists, ``IvraloSettings.gate_rules``); the engine
is ``protocol.code_gate``, which the kernel runs again on each cell (defence in depth: a client
other than ours reaches the kernel without this check). Both are a convenience for agents that want
their code held to a narrow shape, not a boundary: the runtime guards are.
"""

from __future__ import annotations

from ivralo_kernel.host.agent.outputs import error_result
from ivralo_kernel.protocol.code_gate import GateRules, check_code

SECURITY_ERROR = "SecurityError"
DONE_WITH_ERRORS = "done_with_errors"


def gate_refusal(code: str, rules: GateRules | None) -> dict[str, str] | None:
    """The agent's result for code the gate denies (``done_with_errors``, nothing ran), or None."""
    if rules is None:
        return None
    denial = check_code(code, rules)
    if denial is None:
        return None
    return error_result("", f"{SECURITY_ERROR}: {denial.message()}", DONE_WITH_ERRORS)


def is_refusal(error: str) -> bool:
    """An error that is a refusal before the code ran (the kernel's check, or the hermetic surface's)."""
    return error.lstrip().startswith(f"{SECURITY_ERROR}:")
