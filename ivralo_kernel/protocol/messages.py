"""[protocol] Every message that crosses between the kernel and its host, typed.

They travel as JSON: broker requests and answers on the broker's socket (protocol/broker_frames.py),
the host's hello and notices as custom control messages (``names.CONTROL_MSG_TYPES``). Both
sides build and read them through these types, so a renamed field fails ``mypy`` on both sides at
once instead of a cell at run time. Values from the other side are still checked where they are read
(``valid_target``, ``isinstance``): a kernel's code can send anything.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# ---- the broker: both ways on the broker's socket (protocol/broker_frames.py) -------------------


class BrokerRequest(TypedDict):  # kernel -> host
    req_id: str
    kind: str  # names.BROKER_EGRESS, BROKER_API, BROKER_SQL, BROKER_CATALOG
    payload: dict[str, Any]  # one of the payloads below, by kind
    # The msg_id of the execute_request it comes from (the kernel says so; the host checks that this
    # execution runs, as it saw on IOPub).
    parent: str | None


class EgressQuestion(TypedDict):  # BROKER_EGRESS
    host: str
    port: int


class ApiCall(TypedDict):  # BROKER_API
    operation: str
    params: dict[str, Any]


class SqlQuery(TypedDict):  # BROKER_SQL
    database: str
    query: str
    params: NotRequired[dict[str, Any]]


class CallRecord(TypedDict):
    """What the host did with a credential, for the cell's summary (the credential's name, never its value)."""

    what: str
    credential: str
    seconds: float


class BrokerAnswer(TypedDict, total=False):
    """The answer to any request: an egress decision or a call's outcome."""

    allowed: bool  # egress: the decision
    reason: str
    ok: bool  # api, sql, catalog
    result: Any
    error: str
    refused: bool  # a guard's refusal, not a failure of the service
    record: CallRecord


class BrokerReply(TypedDict):  # host -> kernel
    req_id: str
    answer: BrokerAnswer


class BrokerHello(TypedDict):  # control: names.MSG_BROKER_HELLO ("I hear your IOPub")
    comm_id: str


# ---- deadlines and the host's notes -----------------------------------------------------------


class DeadlineNotice(TypedDict):  # control: names.MSG_DEADLINE_NOTICE ("the next interrupt is a deadline")
    msg_id: str
    deadline_ms: int
    act_before: float  # CLOCK_MONOTONIC: a notice that arrives later is stale, and ignored


class EgressNote(TypedDict):  # control: names.MSG_EGRESS_NOTE (for the running cell's "hosts tried")
    host: str
    port: int
    allowed: bool
    reason: str


class StatusReply(TypedDict):  # control: names.MSG_STATUS_REQUEST's reply
    status: str
    executing: str | None  # the execute_request the kernel is running, if any


# ---- what an execution did: its execute_reply's metadata["ivralo"]["effects"] ------------------


class FileEffects(TypedDict):
    created: list[str]  # paths relative to the workspace
    changed: list[str]
    deleted: list[str]


class Effects(TypedDict):
    files: FileEffects
    history: dict[str, str]  # a changed or deleted path -> the id of the history's copy of what it was
    hosts: dict[str, str]  # host -> what happened ("allowed (hosts.allow)", "refused (...)")
    calls: list[CallRecord]  # brokered calls
    processes: list[str]  # programs started from Python (subprocess, os.system, exec, spawn)
    peak_rss_bytes: int  # the kernel's process tree, sampled every 0.1 s while the cell ran
    cpu_s: float  # the kernel's CPU and its waited-for children's
    wall_s: float
    collect_ms: float  # what collecting these cost the kernel
    files_note: NotRequired[str]  # why ``files`` may be incomplete, when it may
