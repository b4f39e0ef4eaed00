"""[host] The workspace's history: the host's ledger of kept copies, listing and restoring them.
Imports settings, sandbox and broker.
"""
