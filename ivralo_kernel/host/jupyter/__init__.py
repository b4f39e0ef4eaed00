"""[host] What jupyter_client and Jupyter's servers start: the provisioner, the kernel manager, the
kernelspec, interpreters, warm spares, the raw launch and the websocket class. Imports every sub-
room but agent.
"""
