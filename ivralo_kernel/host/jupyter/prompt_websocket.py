"""[host] A kernel websocket that sends each message at once, for a Jupyter server or Kernel Gateway.

jupyter_server's kernel websocket leaves Nagle's algorithm on. A cell's answer is several small
websocket frames written back to back (status busy, execute_input, the result, the reply, status
idle), so each frame after the first waits for the client to acknowledge the one before, and
clients delay that acknowledgement by 40 ms. Through Kernel Gateway 3.0.1 a ``1+1`` round trip
took 44-48 ms, for plain ipykernel and ivralo alike, and 7-11 ms with ``TCP_NODELAY`` on the
gateway's side (docs/agents.md, "Remote kernels through a gateway", has the command).

It is the same connection class with that one socket option, selected by the server's documented
setting (nothing is patched)::

    jupyter kernelgateway --KernelGatewayApp.kernel_websocket_connection_class=\\
        ivralo_kernel.host.jupyter.prompt_websocket.PromptKernelWebsocketConnection
    jupyter lab --ServerApp.kernel_websocket_connection_class=\\
        ivralo_kernel.host.jupyter.prompt_websocket.PromptKernelWebsocketConnection

jupyter_server is the server's own package: this module is imported only by a server that names it.
"""

from __future__ import annotations

import asyncio

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection


class PromptKernelWebsocketConnection(ZMQChannelsWebsocketConnection):
    """``ZMQChannelsWebsocketConnection`` whose websocket sends each frame without waiting."""

    def connect(self) -> asyncio.Future[None] | None:  # type: ignore[override]  # as the base class declares it
        # The handler calls connect() from open(), once the websocket handshake is done.
        self.websocket_handler.set_nodelay(True)
        return super().connect()
