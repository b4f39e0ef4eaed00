"""The README and docs/ say only what is true of this checkout (no kernel is started).

Each check reads the pages and compares them with the thing they describe: the Makefile's
targets, the CLI's parser, the messages in the source, the files a link points to, the public
names of INTERFACE.md, the fields of ``WorkerConfig`` and the traits of ``IvraloProvisioner``.
A page that names something that does not exist, or a message that is reworded in the source
but not on the troubleshooting page, fails here.
"""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import pytest

from ivralo_kernel.cli.app import build_parser
from ivralo_kernel.host.agent.session import Session
from ivralo_kernel.host.jupyter.provisioner import IvraloProvisioner
from ivralo_kernel.host.settings.config import WorkerConfig

pytestmark = pytest.mark.fast  # reads files only: the fast tier

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"

# INTERFACE.md's CLI line: subcommand -> the flags it names. Names it announces as coming with this
# turn's issues are held to the same rule once the parser has them.
INTERFACE_CLI = {
    "install": ("--user", "--sys-prefix", "--prefix", "--name", "--python"),
    "doctor": ("--json",),
    "trust": (),
    "untrust": (),
    "run": (),
}
INTERFACE_CLI_COMING = {"config": (), "history": ("--at", "--force")}
# The rest of INTERFACE.md's public names a reader must find in the README or docs/.
INTERFACE_NAMES = (
    "make demo",
    "make test",
    "make lab",
    "python -m ivralo_kernel",
    "Python (ivralo)",
    "ivralo-provisioner",
    "Session",
    "SyncSession",
    "WorkerConfig",
    "WorkerPool",
    ".ivralo/permissions.json",
    "hosts.allow",
    ".ivralo/history/",
    ".ivralo/python-worker.log",
    "databases.json",
    ".env",
)
ELLIPSIS = "…"
SHORTEST_KEY = 10  # every troubleshooting heading has a piece at least this long: it pins the message


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _all_text() -> str:
    return "\n".join(_text(p) for p in PAGES)


def _code(text: str) -> list[str]:
    """Fenced blocks and inline code spans: where commands are written."""
    fence = r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```"
    fenced = re.findall(fence, text, flags=re.M | re.S)
    rest = re.sub(fence, "", text, flags=re.M | re.S)
    return fenced + re.findall(r"`([^`]+)`", rest)


def _makefile_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, flags=re.M)}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _options(parser: argparse.ArgumentParser, tokens: list[str]) -> dict[str, argparse.Action]:
    """The flags a command line may give: a nested action's (``history restore``) when it names one."""
    nested = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if nested is not None and tokens and tokens[0].strip("[](),|") in nested.choices:
        return {**parser._option_string_actions, **nested.choices[tokens[0].strip("[](),|")]._option_string_actions}
    return parser._option_string_actions


def _commands_in(text: str) -> list[tuple[str, list[str]]]:
    """``ivralo-kernel SUB --flag ...`` in code, as (SUB, [tokens after it on that line])."""
    found = []
    for code in _code(text):
        for m in re.finditer(r"ivralo-kernel\s+([a-z][\w-]*)([^\n#]*)", code):
            found.append((m.group(1), m.group(2).split()))
    return found


@cache
def _source_literals() -> tuple[str, ...]:
    """Every literal piece of text in ivralo_kernel: a string constant, or the text between the
    fields of an f-string or of a str.format / %-template."""
    pieces: list[str] = []
    for path in sorted((ROOT / "ivralo_kernel").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                pieces += [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
                pieces += re.split(r"\{[^{}]*\}|%[sdr]", node.value)
    return tuple(pieces)


def _troubleshooting_keys() -> list[str]:
    return re.findall(r"^### `([^`]+)`\s*$", _text(TROUBLESHOOTING), flags=re.M)


def _in_source(key: str) -> list[str]:
    """The pieces of ``key`` (split at …) that no literal of the source contains."""
    literals = _source_literals()
    pieces = [p.strip() for p in key.split(ELLIPSIS)]
    return [piece for piece in pieces if piece and not any(piece in s for s in literals)]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# (a) -----------------------------------------------------------------------------------------------
def test_every_make_target_named_exists() -> None:
    targets = _makefile_targets()
    named = {
        (page.name, m.group(1))
        for page in PAGES
        for code in _code(_text(page))
        for line in code.splitlines()
        for m in re.finditer(r"(?:^|;|&&)\s*make\s+([a-z][\w-]*)", line.split("#")[0])
    }
    assert {"demo", "test"} <= {t for _, t in named}, "the README's two commands"
    missing = sorted((page, t) for page, t in named if t not in targets)
    assert not missing, f"make targets named in the docs but not in the Makefile: {missing}"


def test_the_readme_opens_with_the_two_commands() -> None:
    first_block = _code(_text(README))[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.startswith("make ")]
    assert commands == ["make demo", "make test"], first_block


# (b) -----------------------------------------------------------------------------------------------
def test_every_cli_command_and_flag_named_exists() -> None:
    subcommands = _subcommands()
    problems = []
    for page in PAGES:
        for sub, tokens in _commands_in(_text(page)):
            if sub not in subcommands:
                problems.append(f"{page.name}: ivralo-kernel {sub}: no such subcommand")
                continue
            options = _options(subcommands[sub], tokens)
            for token in tokens:
                flag = token.strip("[](),|").split("=")[0]
                setting = re.fullmatch(r"--(Ivralo\w*)\.(\w+)", flag)
                if setting:  # a settings override: a real section and a real setting
                    if not _is_setting(setting[1], setting[2]):
                        problems.append(f"{page.name}: ivralo-kernel {sub} {flag}: no such setting")
                    continue
                if flag.startswith("--") and flag not in options:
                    problems.append(f"{page.name}: ivralo-kernel {sub} {flag}: no such flag")
    assert not problems, "\n".join(problems)


def test_the_install_flags_table_lists_real_flags() -> None:
    """docs/configuration.md's table of install flags names each flag outside a full command."""
    text = _text(ROOT / "docs" / "configuration.md")
    section = text.split("### `ivralo-kernel install` flags", 1)[1].split("\n#", 1)[0]
    options = _subcommands()["install"]._option_string_actions
    flags = set(re.findall(r"(--[a-z][\w-]*)", section))
    assert len(flags) >= 8, section
    assert not sorted(flags - set(options)), "flags in the table that install does not take"
    documented = {o for o in options if o.startswith("--") and o not in ("--help",)}
    assert not sorted(documented - flags), "install flags the table leaves out"


def test_every_subcommand_is_documented() -> None:
    text = _all_text()
    missing = [sub for sub in _subcommands() if f"ivralo-kernel {sub}" not in text]
    assert not missing, f"subcommands no page shows: {missing}"


# (c) -----------------------------------------------------------------------------------------------
def test_every_troubleshooting_message_is_in_the_source() -> None:
    keys = _troubleshooting_keys()
    assert len(keys) >= 40, "each entry's heading is the message, in backticks"
    problems = {}
    for key in keys:
        missing = _in_source(key)
        if missing:
            problems[key] = missing
        elif max(len(p.strip()) for p in key.split(ELLIPSIS)) < SHORTEST_KEY:
            problems[key] = ["no piece long enough to pin the message"]
    assert not problems, f"messages on the troubleshooting page that the source no longer writes: {problems}"


def test_a_reworded_message_is_caught() -> None:
    """The check above can fail: a heading that differs by one word from the source is reported."""
    assert not _in_source("REPL worker terminated (…). ALL variables in this session were lost: …")
    assert _in_source("REPL worker terminated (…). ALL variables in this session are gone: …")


# (d) -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_points_to_a_file(page: Path) -> None:
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md":
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", _text(file), flags=re.M)}
            if anchor not in slugs:
                problems.append(f"{target}: no such heading")
    assert not problems, problems


def test_every_repository_path_named_exists() -> None:
    named = set(re.findall(r"\b((?:tests|notebooks|bench|kernelspec|docs)/[\w./-]*\w)", _all_text()))
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, missing


# (e) -----------------------------------------------------------------------------------------------
def test_interface_cli_names_are_documented() -> None:
    text = _all_text()
    subcommands = _subcommands()
    expected = dict(INTERFACE_CLI)
    expected.update({sub: flags for sub, flags in INTERFACE_CLI_COMING.items() if sub in subcommands})
    missing = []
    for sub, flags in expected.items():
        assert sub in subcommands, f"INTERFACE.md names `ivralo-kernel {sub}`"
        if f"ivralo-kernel {sub}" not in text:
            missing.append(f"ivralo-kernel {sub}")
        missing += [f"ivralo-kernel {sub} {flag}" for flag in flags if flag not in text]
    assert not missing, missing


def test_interface_public_names_are_documented() -> None:
    text = _all_text()
    assert not [name for name in INTERFACE_NAMES if name not in text]


# Claims about the code's knobs and methods -----------------------------------------------------------
def _is_setting(section: str, name: str) -> bool:
    from ivralo_kernel.host.settings.resolve import SECTIONS, IvraloAgent

    return section in SECTIONS and name in IvraloAgent.class_trait_names(config=True)


def test_every_worker_config_field_is_documented() -> None:
    text = _text(ROOT / "docs" / "agents.md") + _text(ROOT / "docs" / "configuration.md")
    fields = WorkerConfig().as_dict()
    assert len(fields) > 20
    assert not sorted(name for name in fields if f"`{name}`" not in text)


def test_every_setting_is_documented() -> None:
    text = _text(ROOT / "docs" / "configuration.md")
    traits = IvraloProvisioner.class_trait_names(config=True)
    assert len(traits) > 10
    assert not sorted(name for name in traits if f"`{name}`" not in text)


def test_every_session_method_named_exists() -> None:
    named = set(re.findall(r"\bs\.([a-z_]+)\(", _all_text()))
    assert {"run", "interrupt", "get_var"} <= named
    assert not sorted(name for name in named if not callable(getattr(Session, name, None)))


def test_every_in_cell_api_name_exists() -> None:
    tree = ast.parse((ROOT / "ivralo_kernel" / "kernel" / "api.py").read_text(encoding="utf-8"))
    exported = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
    )
    text = _all_text()
    named = set(re.findall(r"\bivralo\.([a-z_]+)\(", text)) | set(re.findall(r"\bivralo\.([A-Z]\w+)", text))
    assert {"call", "sql"} <= named
    assert not sorted(named - set(exported))


def _readme_images() -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(docs/images/([^)\s]+)\)", _text(README))


def test_the_readme_shows_every_screenshot() -> None:
    from showcase_shots import SHOTS

    assert sorted(_readme_images()) == sorted(SHOTS), "the README shows each screenshot the browser tests take"


@pytest.mark.parametrize("name", sorted(__import__("showcase_shots").SHOTS))
def test_a_readme_image_is_there_and_not_stale(name: str) -> None:
    """Missing, or stale: taken before the wording it shows was changed in the code (see
    tests/showcase_shots.py). The fix for both: run tests/test_jupyterlab.py and commit docs/images/."""
    import showcase_shots

    path = showcase_shots.IMAGES / name
    assert path.is_file(), f"docs/images/{name} is missing: run tests/test_jupyterlab.py and commit docs/images/"
    entry = showcase_shots.read_manifest().get(name)
    assert entry is not None, f"docs/images/manifest.json has no entry for {name}: run tests/test_jupyterlab.py"
    assert entry["png_sha256"] == showcase_shots.sha256(path), (
        f"docs/images/{name} is not the image its manifest entry was written with: run tests/test_jupyterlab.py"
    )
    assert entry["shows"] == showcase_shots.shows(name), (
        f"docs/images/{name} is stale: it shows {entry['shows']}, the code now words it {showcase_shots.shows(name)}. "
        "Run tests/test_jupyterlab.py and commit docs/images/."
    )


def test_a_reworded_screenshot_message_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The staleness check reads the wording from the code: change it there and the image is stale."""
    import showcase_shots

    from ivralo_kernel.protocol import names

    monkeypatch.setattr(names, "INTERRUPTED_TEXT", "stopped at deadline_ms={deadline_ms}; variables kept")
    assert "stopped at deadline_ms=2000; variables kept" in showcase_shots.shows("deadline-kill.png")
    assert showcase_shots.read_manifest()["deadline-kill.png"]["shows"] != showcase_shots.shows("deadline-kill.png")
