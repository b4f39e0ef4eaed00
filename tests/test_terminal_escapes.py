"""No raw control character from the kernel reaches the person's terminal: file names, hosts and
messages that code in a cell chose are escaped (``protocol.terminal.terminal_safe``) by ``history``,
``run``, ``doctor`` and the host's relay of the kernel's output.

The kernel test makes the name in a cell (from Python and from ``sh``), then reads the CLI's own
bytes, as a terminal would get them, from outside the kernel.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ivralo_kernel.protocol.terminal import terminal_safe

BIN = Path(sys.executable).parent
# What a terminal acts on: C0 but newline (tab too: alignment), DEL, C1 (UTF-8 C2 80-9F), the bidi
# embeddings/overrides (E2 80 AA-AE), isolates (E2 81 A6-A9), marks (E2 80 8E/8F, D8 9C), U+2028/9.
RAW_CONTROL = re.compile(
    rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]|\xd8\x9c"
)
EVIL = "evil\x1b]0;owned\x07\x1b[2J\nline\u202egnp.txt"  # OSC title + BEL, clear screen, a newline, RLO


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain ünïcödé 名前 🙂", "plain ünïcödé 名前 🙂"),  # printable text of any script stays
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x00\x7f\x9b", "\\x00\\x7f\\x9b"),  # NUL, DEL, an 8-bit CSI
        ("\u202eabc\u202c", "\\u202eabc\\u202c"),
        ("\u2066\u2067\u2068\u2069\u200e\u200f\u061c", "\\u2066\\u2067\\u2068\\u2069\\u200e\\u200f\\u061c"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("bad\udcff", "bad\\xff"),  # an undecodable byte of a file name (surrogateescape)
    ],
)
def test_terminal_safe_escapes_controls_and_keeps_text(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown
    assert not RAW_CONTROL.search(terminal_safe(text).encode("utf-8", "surrogateescape"))


@pytest.mark.fast
def test_text_of_several_lines_keeps_its_lines_and_tabs_only() -> None:
    assert terminal_safe("a\tb\nc\x1b[2J\rd", keep_newlines=True) == "a\tb\nc\\x1b[2J\\rd"


@pytest.mark.fast
def test_the_hosts_relay_of_kernel_output_escapes_too() -> None:
    from ivralo_kernel.host.sandbox.kernel_output import printable

    assert printable("ok\t1\n\x1b]52;c;cm0gLXJmIH4=\x07\u202e\n") == "ok\t1\n\\x1b]52;c;cm0gLXJmIH4=\\x07\\u202e\n"


CELL = f"""
import subprocess
name = {EVIL!r}
open(name, 'w').write('first\\n')
open(name, 'w').write('second \\x1b]52;c;cm0gLXJmIH4=\\x07 \\x1b[2J\\n')  # overwritten: the history keeps the first
print('wrote', name)
script = 'f=$(printf "sh\\\\033]0;t\\\\007\\\\342\\\\200\\\\256x"); echo one > "$f"; printf "%s\\\\n" "$f"'
r = subprocess.run(['sh', '-c', script], capture_output=True, text=True)
print(r.stdout, r.stderr)
"""


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(BIN / "ivralo-kernel"), *argv], cwd=cwd, capture_output=True, timeout=120)


def test_history_and_run_print_no_raw_control_bytes(workspace: Path, tmp_path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CELL)]
    path = workspace / "evil.ipynb"
    nbformat.write(nb, path)
    ran = _cli("run", str(path), cwd=workspace)
    assert ran.returncode == 0, ran
    assert (workspace / EVIL).read_text().startswith("second"), "the cell wrote the file"
    assert any(p.name.startswith("sh\x1b]0;t\x07") for p in workspace.iterdir()), "sh wrote its file too"
    for stream in (ran.stdout, ran.stderr):
        assert not RAW_CONTROL.search(stream), stream
    # What the cell printed keeps its own line breaks (its CSI sequences are dropped, as for any output);
    # the effects line names the file, escaped.
    assert b"  | wrote evil\\x1b]0;owned\\x07\n  | line\\u202egnp.txt" in ran.stdout, ran.stdout
    assert b"  | sh\\x1b]0;t\\x07\\u202ex" in ran.stdout, ran.stdout
    assert b"changed (evil\\x1b]0;owned\\x07\\x1b[2J\\nline\\u202egnp.txt)" in ran.stdout, ran.stdout

    listed = _cli("history", "list", "--workspace", str(workspace), cwd=tmp_path)
    assert listed.returncode == 0, listed
    assert not RAW_CONTROL.search(listed.stdout + listed.stderr), listed.stdout
    assert b"evil\\x1b]0;owned\\x07\\x1b[2J\\nline\\u202egnp.txt" in listed.stdout, listed.stdout
    copy_id = next(line.split()[0] for line in listed.stdout.decode().splitlines() if "evil" in line)

    shown = _cli("history", "show", copy_id, "--workspace", str(workspace), cwd=tmp_path)
    assert shown.returncode == 0, shown
    assert not RAW_CONTROL.search(shown.stdout + shown.stderr), shown.stdout
    assert b"File       evil\\x1b]0;owned" in shown.stdout and b"first" in shown.stdout, shown.stdout


@pytest.mark.fast
def test_doctor_prints_a_hostile_report_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What doctor prints comes from the kernel it started and from the folder it runs in (names in
    a databases.json, an interpreter's path): every field of that report, as text a cell could have
    chosen, is printed escaped."""
    from ivralo_kernel.cli import doctor as doctor_cli

    evil = "x\x1b]0;owned\x07\x1b[2J\n\u202e"
    report = {
        "ok": False,
        "kernel": {"pid": evil, "bootstrap_ms": evil, "interpreter": {"choice": evil}},
        "spares": {"detail": evil},
        "devices": evil,
        "checks": [{"mechanism": evil, "status": "missing", "detail": evil, "next_step": evil}],
    }

    async def probe(settings: tuple[str, ...], project: str | None = None) -> dict[str, object]:
        return report

    monkeypatch.setattr(doctor_cli, "_probe", probe)
    assert doctor_cli.doctor(as_json=False) == 1
    out = capsys.readouterr().out
    assert not RAW_CONTROL.search(out.encode()), out
    assert out.count("x\\x1b]0;owned\\x07\\x1b[2J\\n\\u202e") == 9, out  # the last line names the gap too
    monkeypatch.setattr(doctor_cli, "_probe", lambda *a, **k: probe(()))
    report.clear()
    report.update({"ok": False, "error": evil, "checks": []})
    assert doctor_cli.doctor(as_json=False) == 1
    assert not RAW_CONTROL.search(capsys.readouterr().out.encode())
