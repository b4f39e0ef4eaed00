"""[host] The agent API: Session and SyncSession, the worker pool and worker, the namespace API and its
data plane, outputs, the code gate, test runs and attach; and ``ivralo-kernel mcp``, the Session as MCP
tools (mcp_server, mcp_questions, mcp_serve). Imports every other sub-room.
"""
