"""``Session.connect``: a session on a kernel the person already runs. A plain ipykernel gets no
guards afterwards, and the session says so; an ivralo kernel reports its layers. Either way the
kernel keeps running when the session lets go (judged by its process)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager

from ivralo_kernel.host import Session, SyncSession
from ivralo_kernel.host.agent.attach import AttachError


class _PlainSpecs(KernelSpecManager):  # type: ignore[misc]
    """Plain ipykernel with this interpreter (what `python3` is in a person's Jupyter)."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        return KernelSpec(argv=argv, display_name="Python 3", language="python", resource_dir="")


def started(km: KernelManager, workspace: Path) -> Iterator[KernelManager]:
    km.start_kernel(cwd=str(workspace))
    try:
        yield km
    finally:
        km.shutdown_kernel(now=True)


@pytest.fixture
def plain(workspace: Path) -> Iterator[KernelManager]:
    yield from started(KernelManager(kernel_name="python3", kernel_spec_manager=_PlainSpecs()), workspace)


@pytest.fixture
def ivralo(workspace: Path) -> Iterator[KernelManager]:
    yield from started(KernelManager(kernel_name="ivralo"), workspace)


async def test_a_plain_kernel_is_attached_and_said_to_be_unguarded(plain: KernelManager) -> None:
    async with Session.connect(plain.connection_file) as session:
        assert not session.is_ivralo and session.layers == {}
        first = await session.run("x = 6 * 7\nprint(x)")
        assert isinstance(first, str)
        assert first.startswith("[ivralo] this kernel was not started by ivralo, so its guards cannot be applied")
        assert first.endswith("42\n")
        assert await session.run("print(x + 1)") == "43\n"  # said once; the namespace is the kernel's
        failed = await session.run("1/0")
        assert isinstance(failed, dict) and "ZeroDivisionError" in failed["error"]
    assert plain.is_alive(), "letting go does not stop the person's kernel"


async def test_an_ivralo_kernel_reports_its_layers(ivralo: KernelManager) -> None:
    async with Session.connect(ivralo.connection_file) as session:
        assert session.is_ivralo
        assert set(session.layers) >= {"write_guard", "sandbox"}
        result = await session.run("_ = open('made.txt', 'w').write('x')")
        assert result == ""  # no note: its guards are its own
        assert result.effects is not None and result.effects["files"]["created"] == ["made.txt"]  # type: ignore[union-attr]
    assert ivralo.is_alive()


@pytest.mark.fast
async def test_a_missing_connection_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AttachError, match=r"kernel-gone\.json: no such connection file"):
        Session.connect(str(tmp_path / "kernel-gone.json"))


def test_the_blocking_twin_attaches_runs_and_lets_go(plain: KernelManager) -> None:
    threads_before = {t.ident for t in threading.enumerate()}
    with SyncSession.connect(plain.connection_file) as session:
        assert not session.is_ivralo and session.note is not None
        first = session.run("x = 6 * 7\nprint(x)")
        assert isinstance(first, str) and first.endswith("42\n")
        assert session.run("print(x + 1)") == "43\n"
    session.close()  # again: nothing to do
    assert plain.is_alive(), "letting go does not stop the person's kernel"
    leftover = [t.name for t in threading.enumerate() if t.ident not in threads_before and t.name == "ivralo-attached"]
    assert not leftover, f"the blocking twin's loop thread outlived close(): {leftover}"


@pytest.mark.fast
def test_the_blocking_twin_names_a_missing_connection_file(tmp_path: Path) -> None:
    with pytest.raises(AttachError, match=r"kernel-gone\.json: no such connection file"):
        SyncSession.connect(str(tmp_path / "kernel-gone.json"))
    assert not [t for t in threading.enumerate() if t.name == "ivralo-attached"], "its loop thread was left running"
