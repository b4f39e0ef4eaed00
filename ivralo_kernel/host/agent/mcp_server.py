"""[host] ``ivralo-kernel mcp``: the agent API's ``Session`` as Model Context Protocol tools.

One ``Session`` per MCP client session (over stdio, the one client of the process; over streamable
HTTP, each ``mcp-session-id``; the 2026 stateless protocol over HTTP has no session, so its calls
share one), one call at a time per session (``Session``'s own lock). Only the public agent API is
used: ``Session.run`` and the namespace, history, restore and test calls.

The person's egress answer goes through MCP elicitation (``mcp_questions.py``), asked by this
process: in the legacy handshake as a request from the server (``ctx.elicit``), in the 2026
protocol as an input-required result whose sealed ``request_state`` names the running call, so the
client's next call carries the answer to the cell that waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CallToolResult,
    ContentBlock,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    ImageContent,
    InputRequests,
    InputRequiredResult,
    TextContent,
    ToolAnnotations,
)
from mcp_types.version import is_version_at_least

from ivralo_kernel.host import Session
from ivralo_kernel.host.agent.mcp_questions import PendingQuestion, QuestionDesk

log = logging.getLogger(__name__)

# How often a running cell sends a progress notification: a client with a request timeout that
# counts progress as life (most do) keeps waiting for a long cell.
PROGRESS_EVERY_S = 1.0
STATELESS_PROTOCOL = "2026-07-28"  # from this revision on, a server asks through input-required results
EGRESS_INPUT = "egress_answer"
STDIO_KEY = "stdio"
HTTP_STATELESS_KEY = "http-stateless"
# After a client's cancellation, how long the interrupted call gets to report its loss.
CANCEL_GRACE_S = 10.0

RUN_PYTHON = """Run Python code in a persistent, guarded Jupyter kernel: variables, imports and files
persist between calls.

Returns the cell's output (what it printed, and the value of its last expression) as text, each PNG
it displayed (matplotlib plots) as an image, and structuredContent {status, result, error, effects}:
status "ok", "error" or "done_with_errors"; effects lists the files the cell changed, the hosts it
tried, and its memory and time. On an exception the result is an error whose text is the traceback:
fix the code and call again.
If the cell runs past the deadline it is interrupted and the namespace is kept ("interrupted" in the
error), or, when it would not stop, its kernel is ended and the error names every variable that was
lost: recreate them before going on. When code reaches a network host not yet allowed, the person is
asked; a "no" makes the request fail with 403."""

DESCRIPTIONS = {
    "interrupt": "Stop the running kernel at once, with its whole process tree (the Esc key). Use it when a "
    "run_python call hangs. Returns the message naming the variables that were lost; the next run_python "
    "starts a fresh kernel. Nothing running: says so.",
    "restart": "End this session's kernel and start a fresh one, ready when this returns: every variable is "
    "lost (the message names them, so you can recreate what you need); files on disk stay. Use it when the "
    "namespace is in a bad state. An error says why the fresh kernel could not start.",
    "get_var": "Return the value of one variable of the kernel's namespace: JSON-able values as they are, "
    "others as their repr. An error says the name is not defined: check list_vars.",
    "set_var": "Bind a variable in the kernel's namespace to a JSON value (a number, string, list or object) "
    "without running code. Returns the name set.",
    "list_vars": "Return the names of the variables defined in the kernel's namespace, sorted.",
    "snapshot": "Return every variable of the kernel's namespace with its type and a short summary, without "
    "fetching the values.",
    "history": "Return the kept copies of the files the kernel changed (newest first): each entry's id, path, "
    "time and kind. Give path to see one file's copies. Use an id with restore.",
    "restore": "Put a file back as one of its kept copies (an id from history, or a path for its newest "
    "copy). Returns what was restored. An error says why not (a newer change, a closed path, a read-only "
    "role): read it before retrying.",
    "run_tests": "Run the tests at path (relative to the workspace, default all) with pytest in a fresh kernel "
    "of this project; the session's namespace is untouched. Returns {status, passed, failed, errors, skipped, "
    "output}.",
}


@dataclass
class ClientSession:
    """One MCP client's ``Session``, its question desk, and its calls waiting on an answer."""

    session: Session
    desk: QuestionDesk
    waiting_runs: dict[str, tuple[asyncio.Task[Any], PendingQuestion]] = field(default_factory=dict)

    async def close(self) -> None:
        self.desk.refuse_all()
        for _, question in self.waiting_runs.values():
            question.refuse()
        # Ended at once, without waiting for a call in flight (close alone would wait for its lock).
        await self.session.interrupt()
        await self.session.close()


class ClientSessions:
    """The sessions this server holds, by MCP client; closed with the server or with their client."""

    def __init__(self, make_session: Callable[[QuestionDesk], Session], transport: str) -> None:
        self._make = make_session
        self._transport = transport
        self._by_key: dict[str, ClientSession] = {}

    def key_of(self, ctx: Context) -> str:
        if self._transport == "stdio":
            return STDIO_KEY
        headers = ctx.headers or {}
        return str(headers.get("mcp-session-id") or HTTP_STATELESS_KEY)

    def of(self, ctx: Context) -> ClientSession:
        key = self.key_of(ctx)
        found = self._by_key.get(key)
        if found is None:
            desk = QuestionDesk()
            found = self._by_key[key] = ClientSession(self._make(desk), desk)
        return found

    def keys(self) -> list[str]:
        return list(self._by_key)

    async def close(self, key: str) -> None:
        found = self._by_key.pop(key, None)
        if found is not None:
            await found.close()

    async def close_all(self) -> None:
        for key in list(self._by_key):
            await self.close(key)


def _asks_by_input_required(ctx: Context) -> bool:
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, STATELESS_PROTOCOL)


def _client_elicits(ctx: Context) -> bool:
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    # A bare ``elicitation: {}`` (before modes existed) means forms; url-only does not.
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def tool_result(result: Any) -> CallToolResult:
    """``Session.run``'s result as MCP content: its text, its images, and the contract as structured data."""
    failed = isinstance(result, dict)
    if failed:
        text = result.get("result", "")
        error = result.get("error", "")
        shown = text + ("" if not text or text.endswith("\n") else "\n") + error if error != text else error
    else:
        text, error, shown = str(result), None, str(result)
    content: list[ContentBlock] = [TextContent(type="text", text=shown)]
    content += [ImageContent(type="image", data=png, mime_type="image/png") for png in getattr(result, "images", ())]
    structured = {
        "status": result.get("status", "error") if failed else "ok",
        "result": text,
        "error": error,
        "effects": getattr(result, "effects", None),
    }
    return CallToolResult(content=content, structured_content=structured, is_error=failed)


def _plain(value: Any) -> Any:
    """A value as JSON carries it, else its repr."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


async def _follow(ctx: Context, client: ClientSession, task: asyncio.Task[Any]) -> CallToolResult | InputRequiredResult:
    """Wait for the cell, with progress, asking the person each question it raises; on the client's
    cancellation, interrupt it."""
    started = time.monotonic()
    try:
        while True:
            arrival = client.desk.arrival()
            done, _ = await asyncio.wait({task, arrival}, timeout=PROGRESS_EVERY_S, return_when="FIRST_COMPLETED")
            if task in done:
                client.desk.refuse_all()  # asked at the very end: nobody will answer it now
                return tool_result(task.result())
            question = client.desk.take() if arrival in done else None
            if question is not None:
                if _asks_by_input_required(ctx):
                    run_id = secrets.token_urlsafe(16)
                    client.waiting_runs[run_id] = (task, question)
                    form = ElicitRequestFormParams(
                        message=question.question, requested_schema=question.requested_schema()
                    )
                    asked: InputRequests = {EGRESS_INPUT: ElicitRequest(params=form)}
                    return InputRequiredResult(input_requests=asked, request_state=run_id)
                answered = await ctx.elicit(question.question, question.schema())
                question.take(ElicitResult(action=answered.action, content=_content_of(answered)))
                continue
            if await _client_left(ctx):  # the legacy HTTP transport does not cancel a call whose client left
                with anyio.CancelScope(shield=True):
                    await _stopped(client.session, task)
                return tool_result(task.result()) if task.done() else tool_result({"status": "error", "error": ""})
            await ctx.report_progress(time.monotonic() - started, None, f"running, {time.monotonic() - started:.0f} s")
    except asyncio.CancelledError:
        # The client cancelled the call (or went away): the cell must not run on unseen.
        with anyio.CancelScope(shield=True):
            await _stopped(client.session, task)
        raise


async def _client_left(ctx: Context) -> bool:
    """Over HTTP: has the client's connection for this call closed? (Starlette's own check, which
    takes only a message already waiting.) False on stdio, which has no such request."""
    request = getattr(ctx.request_context, "request", None)
    is_disconnected = getattr(request, "is_disconnected", None)
    if is_disconnected is None:
        return False
    try:
        return bool(await is_disconnected())
    except Exception:  # noqa: BLE001 - a transport without the check: the SDK's own cancellation remains
        return False


async def _stopped(session: Session, task: asyncio.Task[Any]) -> None:
    """Interrupt until the call has ended: cancelled while its kernel was still starting, the first
    interrupt finds none to end, so it is asked again once the kernel is there."""
    deadline = time.monotonic() + CANCEL_GRACE_S
    while not task.done() and time.monotonic() < deadline:
        await session.interrupt()
        await asyncio.wait({task}, timeout=0.2)


def _content_of(answered: Any) -> dict[str, Any] | None:
    data = getattr(answered, "data", None)
    return data.model_dump() if data is not None else None


def build_server(make_session: Callable[[QuestionDesk], Session], transport: str) -> tuple[MCPServer, ClientSessions]:
    """The MCP server and the sessions it will hold (closed by ``serve``)."""
    server: MCPServer = MCPServer(
        "ivralo-kernel",
        instructions="A guarded Python kernel: run_python runs code in a namespace that persists between calls.",
    )
    clients = ClientSessions(make_session, transport)

    async def resumed(ctx: Context, client: ClientSession) -> CallToolResult | InputRequiredResult:
        # request_state is sealed by the SDK (RequestStateBoundary): only an id this server minted gets here.
        waiting = client.waiting_runs.pop(str(ctx.request_state), None)
        if waiting is None:
            raise ToolError(
                "this call's earlier round is gone (answered already, or the server restarted): call run_python again"
            )
        task, question = waiting
        question.take((ctx.input_responses or {}).get(EGRESS_INPUT))
        return await _follow(ctx, client, task)

    @server.tool(description=RUN_PYTHON, annotations=ToolAnnotations(title="Run Python", open_world_hint=True))
    async def run_python(code: str, ctx: Context) -> CallToolResult | InputRequiredResult:
        client = clients.of(ctx)
        client.desk.client_elicits = _client_elicits(ctx)
        if ctx.request_state is not None:
            return await resumed(ctx, client)
        task = asyncio.ensure_future(client.session.run(code))
        return await _follow(ctx, client, task)

    async def guarded(call: Any) -> Any:
        try:
            return await call
        except Exception as exc:  # the model reads the reason and what to do; the server stays up
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    @server.tool(description=DESCRIPTIONS["interrupt"])
    async def interrupt(ctx: Context) -> dict[str, Any]:
        lost = await guarded(clients.of(ctx).session.interrupt())
        return {"interrupted": lost is not None, "message": (lost or {}).get("error", "no kernel was running")}

    @server.tool(description=DESCRIPTIONS["restart"])
    async def restart(ctx: Context) -> dict[str, Any]:
        lost = await guarded(clients.of(ctx).session.restart())
        message = (lost or {}).get("error", "No kernel was running.")
        return {"restarted": True, "message": f"{message} A fresh kernel is ready."}

    @server.tool(description=DESCRIPTIONS["get_var"])
    async def get_var(name: str, ctx: Context) -> dict[str, Any]:
        value = await guarded(clients.of(ctx).session.get_var(name, or_repr=True))
        return {"name": name, "value": _plain(value)}

    @server.tool(description=DESCRIPTIONS["set_var"])
    async def set_var(name: str, value: Any, ctx: Context) -> dict[str, Any]:
        await guarded(clients.of(ctx).session.set_var(name, value))
        return {"name": name, "set": True}

    @server.tool(description=DESCRIPTIONS["list_vars"])
    async def list_vars(ctx: Context) -> dict[str, Any]:
        return {"names": await guarded(clients.of(ctx).session.list_vars())}

    @server.tool(description=DESCRIPTIONS["snapshot"])
    async def snapshot(ctx: Context) -> dict[str, Any]:
        return {"variables": _plain(await guarded(clients.of(ctx).session.snapshot()))}

    @server.tool(description=DESCRIPTIONS["history"])
    async def history(ctx: Context, path: str | None = None) -> dict[str, Any]:
        return {"entries": _plain(await guarded(clients.of(ctx).session.history(path)))}

    @server.tool(description=DESCRIPTIONS["restore"])
    async def restore(id: str, ctx: Context) -> dict[str, Any]:  # the name for it
        return {"restored": _plain(await guarded(clients.of(ctx).session.restore(id)))}

    @server.tool(description=DESCRIPTIONS["run_tests"])
    async def run_tests(ctx: Context, path: str = ".") -> dict[str, Any]:
        report: dict[str, Any] = await guarded(clients.of(ctx).session.run_tests(path))
        return {str(k): _plain(v) for k, v in report.items()}

    return server, clients
