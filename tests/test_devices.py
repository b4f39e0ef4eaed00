"""GPUs in the kernel (issue 31, Must 11): the `devices` setting passes the machine's GPU device nodes
through the sandbox's minimal /dev and Landlock's write floor (auto), or none, or a list.

This machine has no GPU, so the test makes a stand-in: a device node named like NVIDIA's
(``/dev/nvidia-ivralo-test-*``) with /dev/zero's numbers, which the kernel opens for reading and
writing as a GPU library would. (A pty's terminal side, which would let the test see the writes from
outside, cannot stand in: Linux refuses it, EIO, through any node outside its devpts.)"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.sandbox.bwrap import availability

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node (mknod) needs root")


@pytest.fixture
def gpu() -> Iterator[str]:
    """The stand-in's path."""
    path = f"/dev/nvidia-ivralo-test-{uuid.uuid4().hex[:8]}"
    os.mknod(path, 0o666 | stat.S_IFCHR, os.stat("/dev/zero").st_rdev)
    os.chmod(path, 0o666)
    try:
        yield path
    finally:
        os.unlink(path)


USE = (
    "import os, stat\nprint(stat.S_ISCHR(os.stat({path!r}).st_mode))\n"
    "with open({path!r}, 'r+b', buffering=0) as gpu:\n    print(gpu.write(b'work'), gpu.read(4))"
)
MODES = ["sandbox", "fallback"] if availability()[0] is not None else ["fallback"]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", MODES)
async def test_a_gpu_is_passed_through_by_default_and_not_with_none(workspace: Path, gpu: str, mode: str) -> None:
    path = gpu
    sandbox = "required" if mode == "sandbox" else "off"
    async with Session(workspace=workspace, config=WorkerConfig(sandbox=sandbox)) as session:
        result = await session.run(USE.format(path=path))
    assert result == "True\n4 b'\\x00\\x00\\x00\\x00'\n", result

    async with Session(workspace=workspace, config=WorkerConfig(sandbox=sandbox, devices="none")) as session:
        result = await session.run(USE.format(path=path))
        landlock = await session.run("from ivralo_kernel.kernel.launch_state import STATE; print(STATE.layers)")
    assert isinstance(result, dict), result
    if mode == "sandbox":  # not in the sandbox's /dev at all
        assert "FileNotFoundError" in result["error"], result
    else:  # the host's /dev, but refused by the write guard (and, beneath it, Landlock's floor)
        assert "PermissionError" in result["error"] or "write guard" in result["error"], (result, landlock)
