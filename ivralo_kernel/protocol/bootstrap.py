"""[protocol] How a Python command runs one of ivralo's modules, in ivralo's interpreter or in a
project's interpreter that has not installed ivralo (or ipykernel).

A project's interpreter runs the kernel with ivralo's own packages on a *private path*, given in
``IVRALO_CODE_PATH`` (``os.pathsep``-separated) and served by a one-line bootstrap (``-c``) through
``protocol.private_code``: only the kernel side's modules (``IVRALO_CODE_MODULES``), after the
project's site-packages, so the project's own versions of any package win and nothing else of
ivralo's environment is importable. ``PYTHONPATH`` would do the opposite (it goes before
site-packages, with everything in it) and would reach every Python the kernel starts. The variables
travel with the environment through each hop (the supervisor's re-exec, the kernel's exec, the raw
launch's handover), and each hop builds its command here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from ivralo_kernel.protocol import names

# ``sys.argv[1]`` is the module; popped so the module sees the arguments it would after ``-m``.
# The private path is on ``sys.path`` only while ``protocol.private_code`` loads from it.
BOOTSTRAP = (
    "import os,sys;"
    f"p=[p for p in os.environ.get({names.ENV_CODE_PATH!r},'').split(os.pathsep) if p];sys.path+=p;"
    "from ivralo_kernel.protocol.private_code import install;install(p);"
    "import runpy;runpy.run_module(sys.argv.pop(1),run_name='__main__',alter_sys=True)"
)


def module_argv(
    python: str,
    module: str,
    args: Sequence[str] = (),
    flags: Sequence[str] = ("-P", "-B"),
    *,
    private_path: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """``python FLAGS -m MODULE ARGS``, or the bootstrap's equivalent when the private path is used
    (``private_path``; None: when ``env``, by default this process's, names one)."""
    if private_path is None:
        private_path = bool((os.environ if env is None else env).get(names.ENV_CODE_PATH))
    if private_path:
        return [python, *flags, "-c", BOOTSTRAP, module, *args]
    return [python, *flags, "-m", module, *args]
