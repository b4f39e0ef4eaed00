"""[protocol] The devices a kernel may use besides its null device and terminals: GPUs.

The sandbox's ``/dev`` is a fresh minimal one, and Landlock's write floor refuses every device not
named, so without this ``torch.cuda.is_available()`` would be False in ivralo and True in python3 on
the same machine. The ``devices`` setting says which are passed through:

* ``auto`` (the default): the GPU device nodes present on this machine: NVIDIA's ``/dev/nvidia*``
  (the devices, ``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps/``), the DRM render and card nodes
  (``/dev/dri/``: Intel, AMD, any DRM driver) and AMD's compute device (``/dev/kfd``);
* ``none``: no device beyond the minimal ``/dev``;
* a list of absolute paths under ``/dev``: those, where they exist.

The host resolves the list (``resolve``), binds each path into the sandbox as a device, and passes
the list in the kernel's policy; the kernel adds each to its Landlock write floor and its write guard.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

AUTO, NONE = "auto", "none"
GPU_PATTERNS = ("/dev/nvidia*", "/dev/dri", "/dev/kfd")


def check_setting(value: Iterable[str]) -> str | None:
    """Why ``value`` is no devices setting, or None: ``[auto]``, ``[none]``, or absolute /dev paths."""
    items = list(value)
    if items in ([AUTO], [NONE]):
        return None
    for item in items:
        if item in (AUTO, NONE):
            return f"{item!r} stands alone (give [{item!r}], or a list of paths)"
        if not item.startswith("/dev/") or os.path.normpath(item) != item:
            return f"{item!r} is not an absolute, normalized path under /dev"
    return None


def resolve(value: Iterable[str], root: str = "") -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the device paths to pass through, the listed ones that are not there). ``root``: a prefix
    the patterns are looked up under (tests); the paths returned are without it."""
    items = list(value)
    if items == [NONE]:
        return (), ()
    if items == [AUTO]:
        found = [match[len(root) :] for pattern in GPU_PATTERNS for match in sorted(glob.glob(root + pattern))]
        return tuple(dict.fromkeys(found)), ()
    present = tuple(p for p in items if os.path.exists(root + p))
    return present, tuple(p for p in items if p not in present)
