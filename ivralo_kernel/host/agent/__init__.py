"""[host] The agent API: Session and SyncSession, the worker pool and worker, the namespace API and its
data plane, outputs, the code gate, test runs and attach. Imports every other sub-room.
"""
