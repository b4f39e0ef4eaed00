"""[protocol] The words for each sandbox mode: what the OS sandbox holds, and what each mode does not
stop. The kernel's report (kernel_info, the banner, ``doctor``) and the host's own facts (the
JupyterLab status bar's endpoint, host/jupyter/lab_server.py) say it in the same words.
"""

from __future__ import annotations

SANDBOX_LAYER = (
    "bwrap: user, mount, pid, ipc, uts, net and cgroup namespaces; root file system read-only, workspace "
    "writable, .git/.ivralo/databases.json read-only, .env unreadable, credential stores empty, no unix "
    "socket of the machine, "
    "only this sandbox's processes"
)
FALLBACK_GAPS = (
    "a subprocess or ctypes can reach the network directly, write .git/, .ivralo/ and the tool files "
    "other programs run (.vscode, .envrc, ...) inside the workspace and replace a closed name that is a "
    "link (Landlock keeps only the top and the dot-entries of a home folder the workspace holds), read "
    ".env and the files outside the workspace that the read floor allows; run as root, it can read "
    "other processes' environments"
)
# What the OS sandbox leaves open by design (DESIGN.md §5): the host says this of a sandboxed kernel.
SANDBOX_GAPS = (
    "the workspace is writable by design: code can create, change and delete its files (the history keeps "
    "copies of what it overwrites or deletes); hosts the person or the folder's hosts.allow allowed are "
    "reachable through the egress proxy; the brokered calls the kernel's grants name are answered"
)
