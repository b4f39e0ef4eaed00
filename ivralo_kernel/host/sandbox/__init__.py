"""[host] Each kernel's OS sandbox and the links through its wall: which bubblewrap and its plan,
limits and closed paths, the channel relay and its stdin questions, the egress proxy and policy, the
exchange folder, the kernel's output. Imports settings only.
"""
