"""[host] Answer an execution whose kernel was killed, in its own cell, on the kernel's ports.

When the watchdog kills a kernel, the request it was running never gets a reply: JupyterLab's
cell stays ``[*]`` until the restart dialog says the kernel "appears to have died". Between the kill
and the relaunch the ports are free, so the host binds them for a moment and sends what the kernel
would have sent: the ``error`` output and ``idle`` on IOPub, and the ``execute_reply`` on shell to
the requester (a client's shell socket identity is its session id in jupyter_client and
jupyter_server). The clients' sockets reconnect on their own, to us and then to the new kernel.
"""

from __future__ import annotations

import time
from typing import Any

import zmq
from jupyter_client.session import Session as JupyterSession

from ivralo_kernel.protocol.processes import channel_url

RECONNECT_WAIT_S = 2.5  # how long clients get to reconnect to us (libzmq retries every 100 ms)
SUBSCRIBERS_SETTLE_S = 0.5  # after a subscriber is back, how long we wait for the next one
HOLD_S = 0.3  # how long the shell port stays ours after the answer, to answer a quick next request


NOT_RUN = "ivralo was starting a fresh kernel when this request arrived, so it did not run. Run it again."


def _refuse_while_replacing(session: JupyterSession, shell: zmq.Socket[Any], iopub: zmq.Socket[Any]) -> None:
    """Answer one request that reached us instead of the (replaced) kernel."""
    frames = shell.recv_multipart()
    try:
        idents, parts = session.feed_identities(frames)
        request = session.deserialize(parts, content=False)
    except (ValueError, KeyError):
        return  # not a signed request: nothing to answer
    header = request["header"]
    msg_type = str(header.get("msg_type", ""))
    if not msg_type.endswith("_request"):
        return
    error = {"ename": "KernelRestarting", "evalue": NOT_RUN, "traceback": [NOT_RUN]}
    reply_type = msg_type.removesuffix("_request") + "_reply"
    session.send(iopub, "status", {"execution_state": "busy"}, parent=request)
    if msg_type == "execute_request":
        session.send(iopub, "error", error, parent=request)
    session.send(shell, reply_type, {"status": "error", "execution_count": None, **error}, parent=request, ident=idents)
    session.send(iopub, "status", {"execution_state": "idle"}, parent=request)


def answer_lost_execution(
    info: dict[str, Any], parent: dict[str, Any], requester: tuple[bytes, ...], text: str
) -> bool:
    """Send ``text`` as the error of the execution ``parent``; True when the requester got the reply.

    ``requester`` is the shell routing envelope the kernel reported in its "busy" metadata (the
    host never sees shell traffic).
    """
    key = info["key"].encode() if isinstance(info["key"], str) else info["key"]
    session = JupyterSession(key=key, signature_scheme=info.get("signature_scheme", "hmac-sha256"))
    context = zmq.Context()
    iopub = context.socket(zmq.XPUB)
    iopub.setsockopt(zmq.XPUB_VERBOSE, 1)  # see every subscriber come back, not only the first
    shell = context.socket(zmq.ROUTER)
    shell.setsockopt(zmq.ROUTER_MANDATORY, 1)  # raise, rather than drop, while the peer reconnects
    shell.setsockopt(zmq.ROUTER_HANDOVER, 1)  # as the kernel's own (channel_relay.HANDOVER_CHANNELS)
    try:
        iopub.bind(channel_url(info, "iopub"))
        shell.bind(channel_url(info, "shell"))
        deadline = time.monotonic() + RECONNECT_WAIT_S
        settled: float | None = None
        # A host has several IOPub subscribers (jupyter_server: an activity watcher and one per
        # browser tab), each back at its own pace: publish once none has come back for a while.
        while time.monotonic() < (settled or deadline):
            if iopub.poll(20):
                iopub.recv()  # one subscription
                settled = min(deadline, time.monotonic() + SUBSCRIBERS_SETTLE_S)
        error = {"ename": "KernelKilled", "evalue": text, "traceback": [text]}

        def publish() -> None:
            session.send(iopub, "error", error, parent=parent)
            session.send(iopub, "status", {"execution_state": "idle"}, parent=parent)

        publish()
        delivered = False
        reply = {"status": "error", "execution_count": None, **error}
        while requester and not delivered and time.monotonic() < deadline:
            try:
                session.send(shell, "execute_reply", reply, parent=parent, ident=list(requester))
                delivered = True
            except zmq.ZMQError:  # EHOSTUNREACH: that client's shell socket is not back yet
                time.sleep(0.01)
        # A client may send its next request (JupyterLab's "Run All") the moment it has the reply.
        # While we still hold the port, such a request is answered, not lost: it did not run, and
        # the person is told to run it again. After we close, clients queue until the new kernel binds.
        hold_until = time.monotonic() + HOLD_S
        while (left := hold_until - time.monotonic()) > 0:
            if shell.poll(max(1, int(left * 1000))):
                _refuse_while_replacing(session, shell, iopub)
        shell.close(linger=500)
        # A subscriber that came back only now missed the answer: publish again. Tabs that already
        # had it show the message twice, which beats a cell stuck at [*].
        late = False
        while iopub.poll(0 if late else 50):
            iopub.recv()
            late = True
        if late:
            publish()
        return delivered
    except zmq.ZMQError:
        return False  # a port was taken meanwhile: the kernel is replaced without the message
    finally:
        iopub.close(linger=500)
        shell.close(linger=500)
        context.term()
