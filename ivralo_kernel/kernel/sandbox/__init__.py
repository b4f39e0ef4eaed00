"""[kernel] What the kernel learns and keeps of its sandbox: the mounts it sees, its own ports, the
unix-socket filter, the home folder's top level in the fallback, and the layer report doctor and the
banner show.
"""
