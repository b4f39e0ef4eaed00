"""[host] Calls a kernel asks the host to make for it: the broker's responder, its operations, the
databases and the vault of credentials. Imports settings and sandbox.
"""
