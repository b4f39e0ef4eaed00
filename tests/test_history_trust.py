"""History keeps what a cell overwrote, truncated, renamed over or deleted, byte for byte; the
read-only role refuses every write; trust is granted from the person's shell, never from code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ivralo_kernel.cli import main
from ivralo_kernel.host import SyncSession
from ivralo_kernel.protocol.trust import is_trusted

PAYLOAD = bytes(range(256)) * 40  # binary, not text: restored byte-exact


def history_copies(ws: Path) -> list[dict[str, object]]:
    index = ws / ".ivralo" / "history" / "index.jsonl"
    return [json.loads(line) for line in index.read_text().splitlines()]


@pytest.mark.parametrize(
    ("code", "operation"),
    [
        ("open('kept.bin', 'wb').write(b'new')", "open for writing"),
        ("os.truncate('kept.bin', 0)", "truncate"),
        ("open('other.bin', 'wb').write(b'x'); os.replace('other.bin', 'kept.bin')", "move onto"),
        ("os.remove('kept.bin')", "delete"),
        ("import shutil; os.mkdir('d'); os.rename('kept.bin', 'd/kept.bin'); shutil.rmtree('d')", "delete"),
    ],
    ids=["overwrite", "truncate", "rename-over", "delete", "rmtree"],
)
def test_history_restores_byte_exact(workspace: Path, code: str, operation: str) -> None:
    (workspace / "kept.bin").write_bytes(PAYLOAD)
    with SyncSession(workspace=workspace) as session:
        assert isinstance(session.run(f"import os\n{code}"), str)
    copies = history_copies(workspace)
    assert copies[-1]["operation"] == operation
    assert str(copies[-1]["path"]).endswith("kept.bin")
    restored = (workspace / ".ivralo" / "history" / str(copies[-1]["copy"])).read_bytes()
    assert restored == PAYLOAD


@pytest.mark.fast
def test_history_is_bounded_and_refuses_what_it_cannot_keep(tmp_path: Path) -> None:
    from ivralo_kernel.guards.history import History
    from ivralo_kernel.protocol import GuardRefusal

    history = History(str(tmp_path / "history"), cap_bytes=1000)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(GuardRefusal, match="more than the history cap of 1000 bytes") as refused:
        history.save(str(big), "open for writing")
    assert "raise IVRALO_HISTORY_CAP_BYTES" in str(refused.value)
    assert isinstance(refused.value, PermissionError)
    for n in range(5):  # 5 x 300 bytes under a 1000-byte cap: the oldest go first
        f = tmp_path / f"f{n}.bin"
        f.write_bytes(bytes([n]) * 300)
        history.save(str(f), "delete")
    kept = sorted(p.name for p in (tmp_path / "history").iterdir() if p.suffix == ".bin")
    assert len(kept) == 3 and kept[-1].endswith("f4.bin") and not any(k.endswith("f0.bin") for k in kept)


OVERWRITES = """
import time, statistics as s
_t = []
for n in range(10_000):
    _s = time.perf_counter()
    with open('tiny.txt', 'w') as f:
        f.write(str(n % 10))
    _t.append(time.perf_counter() - _s)
print(s.median(_t[:1000]), s.median(_t[-1000:]))
"""


async def test_history_holds_steady_at_its_caps(workspace: Path) -> None:
    """10,000 overwrites of a 1-byte file through a kernel: the folder and its index stay at their
    caps (counted on disk), and the last 1,000 writes cost what the first 1,000 did."""
    from ivralo_kernel.host import IvraloKernelManager

    (workspace / "tiny.txt").write_text("0")
    manager = IvraloKernelManager.for_settings(python=sys.executable, history_cap_count=50, history_cap_bytes=40)
    await manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        out: list[str] = []
        reply = await client.execute_interactive(
            OVERWRITES, timeout=100, output_hook=lambda m: out.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)
    first, last = (float(x) for x in "".join(out).split())
    folder = workspace / ".ivralo" / "history"
    copies = [p for p in folder.iterdir() if not p.name.startswith("index.jsonl")]
    assert len(copies) == 40  # the byte cap (40 one-byte copies) binds before the count cap (50)
    assert sum(p.stat().st_size for p in copies) <= 40
    assert len((folder / "index.jsonl").read_text().splitlines()) <= 2 * 50
    assert last <= 2 * first + 0.0005, (first, last)  # generous: a noisy machine, medians of 1,000


def test_readonly_role_refuses_every_write_and_names_the_tools(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("keep me")
    with SyncSession(workspace=workspace, role="readonly") as session:
        result = session.run("open('notes.txt', 'w')")
        assert isinstance(result, dict)
        assert "this session's Python only reads" in result["error"]
        assert "edit_file or write_file" in result["error"]
        assert session.run("print(open('notes.txt').read())") == "keep me\n"
        shell = session.run(
            "import subprocess\nprint(subprocess.run(['sh', '-c', 'echo x > notes.txt'], capture_output=True, "
            "text=True).returncode)"
        )
        assert shell == "2\n", "the OS floor refuses the shell too"
    assert (workspace / "notes.txt").read_text() == "keep me"


def test_trust_is_granted_from_the_shell_and_opens_the_gate(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (workspace / "helper_mod.py").write_text("ANSWER = 42\n")
    with SyncSession(workspace=workspace) as session:
        refused = session.run("import helper_mod")
        assert isinstance(refused, dict) and f"ivralo-kernel trust {workspace.resolve()}" in refused["error"]
        # A file run by its path runs (the person named it); the folder's modules it imports do not.
        (workspace / "script.py").write_text("print('ran by path')\nimport helper_mod\n")
        ran = session.run("%run script.py")
        assert isinstance(ran, dict) and "ran by path" in ran["result"], ran
        assert "a file run on purpose by its path, as %run does, is not gated" in ran["error"], ran
        # The code cannot grant itself trust: the trust store is outside the workspace.
        store = Path(os.environ["IVRALO_CONFIG_HOME"]) / "trusted-folders.json"
        denied = session.run(f"open({str(store)!r}, 'w').write('{{}}')")
        assert isinstance(denied, dict) and "outside the workspace" in denied["error"]
    assert main(["trust", str(workspace)]) == 0
    assert "Trusted:" in capsys.readouterr().out and is_trusted(str(workspace), os.environ)
    try:
        with SyncSession(workspace=workspace) as session:
            assert session.run("import helper_mod\nprint(helper_mod.ANSWER)") == "42\n"
    finally:
        assert main(["untrust", str(workspace)]) == 0
    assert not is_trusted(str(workspace), os.environ)
