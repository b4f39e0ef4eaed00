"""[cli] ``ivralo-kernel mcp``: the agent API as an MCP server (``host/agent/mcp_server.py``), for Claude
Desktop and Claude Code, Cursor, VS Code's agent mode and any MCP client.

stdout is the protocol's channel over stdio, so everything this command says goes to stderr."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Sequence
from typing import Any

from ivralo_kernel.protocol import IvraloError

INSTALL_HINT = (
    "needs the Model Context Protocol SDK, which is an optional extra. Install it with: "
    "pip install 'ivralo-kernel[mcp]' (or uv tool install 'ivralo-kernel[mcp]'), then run this again"
)


def serve_mcp(
    *,
    workspace: str | None,
    transport: str,
    host: str,
    port: int,
    settings: Sequence[str],
    given: dict[str, Any],
    grants: Sequence[str],
    role: str | None,
    project: str | None,
) -> int:
    try:  # only to say how to get the SDK when it is missing (this room imports no SDK itself)
        missing = importlib.util.find_spec("mcp") is None
    except (ImportError, ValueError):  # ValueError: a module set to None (what the test does)
        missing = True
    if missing:
        raise IvraloError(INSTALL_HINT)
    from ivralo_kernel.host import Session, WorkerConfig
    from ivralo_kernel.host.agent.mcp_questions import QuestionDesk
    from ivralo_kernel.host.agent.mcp_serve import serve_http, serve_stdio

    # The settings model as for `run`: config files, then --IvraloAgent.NAME=, then the flags; checked now,
    # so a bad value is refused before any client connects.
    config = WorkerConfig.from_command_line(tuple(settings), **{k: v for k, v in given.items() if v is not None})
    folder = os.path.realpath(workspace or project or ".")
    if not os.path.isdir(folder):
        raise IvraloError(f"--workspace {workspace}: no such folder. Give an existing folder the kernel may work in.")

    def make_session(desk: QuestionDesk) -> Session:
        return Session(folder, config=config, role=role, grants=tuple(grants), ask=desk.ask, project=project)

    if transport == "http":
        asyncio.run(serve_http(make_session, host, port))
    else:
        asyncio.run(serve_stdio(make_session))
    return 0
