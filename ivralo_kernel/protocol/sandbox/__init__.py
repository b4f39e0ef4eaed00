"""[protocol] What both sides know of the sandbox: the seccomp filters and their BPF, containers and
the platform's support, the closed names and the links covered over themselves, the fallback's read
list.
"""
