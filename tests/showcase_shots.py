"""The README's screenshots (docs/images/*.png): what each one shows, and how staleness is judged.

Each shot's ``shows`` are the texts the image must contain, built from the code that words them
(the write guard's decision, ``INTERRUPTED_TEXT``, the killed cell's text, the egress question and
prompt, the hosts-tried line, the broker's record line). Parts that differ from run to run (a
workspace path, a port, a time) are cut out, so each text becomes fragments that must all be shown.

- tests/test_jupyterlab.py (a browser, slow) checks that the page shows every fragment, then takes
  the screenshot and writes its entry in docs/images/manifest.json: the fragments and the PNG's sha256.
- tests/test_docs.py (fast, no process) fails when a README image is missing, has no manifest entry,
  is not the PNG its entry was written with, or when its entry's fragments are not what the code
  words today: a message reworded in code makes the committed image stale until the browser tests
  take it again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
MANIFEST = IMAGES / "manifest.json"
VARIES = "\x00"  # where a text differs from run to run
DEADLINE_MS = 2000  # the lab's deadline kernelspec (tests/test_jupyterlab.py)
REFUSED_PATH = "/etc/ivralo-nope"
DB_CREDENTIAL = "LAB_SHOP_DB_URL"


def _fragments(*texts: str) -> list[str]:
    return [part for text in texts for part in text.split(VARIES) if part.strip()]


def refusal() -> list[str]:
    from ivralo_kernel.guards.fs import FsPolicy, decide_write

    refused = decide_write("open for writing", REFUSED_PATH, FsPolicy(workspace="/" + VARIES))
    assert refused is not None
    return _fragments(f"{type(refused).__name__}: {refused}".replace("/" + VARIES, VARIES))


def deadline_kill() -> list[str]:
    from ivralo_kernel.host.jupyter.provisioner import killed_cell_text
    from ivralo_kernel.protocol import names

    cause = f"timeout: execution exceeded deadline_ms={DEADLINE_MS}"  # DeadlineWatch.cause
    return _fragments(names.INTERRUPTED_TEXT.format(deadline_ms=DEADLINE_MS), killed_cell_text(cause, VARIES))


def egress_question() -> list[str]:
    from ivralo_kernel.guards.network import hosts_tried_line
    from ivralo_kernel.host.sandbox.egress import ALWAYS_NEEDS_TRUST, cell_question
    from ivralo_kernel.host.sandbox.person_question import prompt_text
    from ivralo_kernel.protocol.network.egress import UNTIL_RESTART, outcome_text

    # The lab's folder is not trusted: the question says what offers "always" (the path varies).
    question = cell_question("localhost", 1).replace("port 1", "port " + VARIES)
    question += ALWAYS_NEEDS_TRUST.format(path=VARIES)
    asked = prompt_text(question, ["yes", "no"]).rstrip()
    return _fragments(asked, hosts_tried_line({"localhost": outcome_text(True, UNTIL_RESTART)}))


def record_line() -> list[str]:
    from ivralo_kernel.kernel.api import record_line

    line = record_line([{"what": "shop database", "credential": DB_CREDENTIAL, "seconds": 0.0}])
    return _fragments(line.replace("0.0s)]", VARIES + "s)]"))


# The JupyterLab extension's shots (labextension/src/*.ts words them; these are its literals).
EFFECTS_FILE = "summary.csv"  # written by a cell whose source builds the name from chr() codes
EFFECTS_KEPT = "prices.csv"  # changed by a cell, then restored from the effects line


def sandbox_status() -> list[str]:
    from ivralo_kernel.protocol.sandbox.modes import SANDBOX_GAPS

    return _fragments(
        f"ivralo: sandboxed · deadline {DEADLINE_MS // 1000} s · memory {VARIES}",
        "OS sandbox (bubblewrap)",
        f"Not stopped in this mode: {SANDBOX_GAPS}.",
    )


def effects_line() -> list[str]:
    return _fragments(
        f"ivralo: created {EFFECTS_FILE}",
        f"created: {EFFECTS_FILE}",
        f"ivralo: changed {EFFECTS_KEPT}",
        f"changed: {EFFECTS_KEPT}",
        f"Restored {EFFECTS_KEPT} ({VARIES}) from copy {VARIES}",
    )


def egress_dialog() -> list[str]:
    from ivralo_kernel.host.sandbox.egress import ALWAYS_NEEDS_TRUST, cell_question

    question = cell_question("localhost", 1).replace("port 1", "port " + VARIES)
    question += ALWAYS_NEEDS_TRUST.format(path=VARIES) + "."
    return _fragments("ivralo: allow this connection?", question, "Deny", "Allow once")


# image name -> the fragments it shows
SHOTS: dict[str, Any] = {
    "refusal.png": refusal,
    "deadline-kill.png": deadline_kill,
    "egress-question.png": egress_question,
    "record-line.png": record_line,
    "sandbox-status.png": sandbox_status,
    "effects-line.png": effects_line,
    "egress-dialog.png": egress_dialog,
}


def shows(name: str) -> list[str]:
    fragments: list[str] = SHOTS[name]()
    return fragments


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest() -> dict[str, Any]:
    if not MANIFEST.is_file():
        return {}
    data: dict[str, Any] = json.loads(MANIFEST.read_text(encoding="utf-8"))
    return data


def record(name: str, fragments: list[str]) -> None:
    """(the browser test, after its screenshot) This image, the fragments it was checked to show."""
    manifest = read_manifest()
    manifest[name] = {"shows": fragments, "png_sha256": sha256(IMAGES / name)}
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n", encoding="utf-8")
