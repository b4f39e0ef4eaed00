"""[host] The old import path of ``PromptKernelWebsocketConnection``, kept for people's Jupyter configs:
the class lives in ``ivralo_kernel.host.jupyter.prompt_websocket``."""

from ivralo_kernel.host.jupyter.prompt_websocket import PromptKernelWebsocketConnection

__all__ = ["PromptKernelWebsocketConnection"]
