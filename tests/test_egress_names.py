"""Host names read for what they mean before anything judges them: every numeric and mapped form of
this machine's addresses (inet_aton's octal, hex, short and one-number forms; IPv4-mapped, -compatible
and NAT64 IPv6; ``0.0.0.0`` and ``::``; ``localhost.`` and names under localhost), the person's
private network, and names that are no host at all.

The unit tests read strings only (no address is reached). The kernel tests reach 127.0.0.1 alone,
spelled each way code could spell it, and judge from outside: the loopback server's hits, and the
questions the host asked.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sandbox_cases import counting_http

from ivralo_kernel.host.sandbox.egress import AGENT_QUESTION, cell_question, grant_key, untrusted_note
from ivralo_kernel.protocol.network.egress import is_loopback, load_egress_policy
from ivralo_kernel.protocol.network.egress_names import (
    LINK_LOCAL,
    PRIVATE,
    THIS_MACHINE,
    HostNameError,
    normalize,
)

# Every way the red team reached the host's loopback with a yes given to a literal (issue 25).
LOOPBACK_SPELLINGS = ("0.0.0.0", "0177.0.0.1", "0x7f000001", "127.1", "2130706433", "[::ffff:127.0.0.1]")


@pytest.mark.fast
@pytest.mark.parametrize(
    ("written", "host"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),  # short dotted: the last part fills the bytes left
        ("127.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # one 32-bit number
        ("0x7f000001", "127.0.0.1"),  # hex
        ("0X7F000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),  # a trailing dot
        ("127.255.255.254", "127.255.255.254"),
        ("0.0.0.0", "0.0.0.0"),  # unspecified: Linux connects it to this machine
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),  # glibc reads a bare 0x as zero
        ("::", "::"),
        ("::1", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),  # IPv4-mapped
        ("[::ffff:127.0.0.1]", "127.0.0.1"),
        ("::ffff:7f00:1", "127.0.0.1"),
        ("::ffff:0:127.0.0.1", "127.0.0.1"),  # SIIT's IPv4-translated form
        ("::127.0.0.1", "127.0.0.1"),  # IPv4-compatible (deprecated, still parsed)
        ("64:ff9b::127.0.0.1", "127.0.0.1"),  # NAT64, well-known prefix
        ("64:ff9b::7f00:1", "127.0.0.1"),
        ("64:ff9b:1::7f00:1", "127.0.0.1"),  # NAT64, local-use prefix
        ("2002:7f00:1::", "127.0.0.1"),  # 6to4
        ("::1%lo", "::1"),  # a scope
        ("localhost", "localhost"),
        ("LOCALHOST.", "localhost"),
        ("api.localhost", "localhost"),  # RFC 6761: every name under localhost
        ("a.b.localhost.", "localhost"),
    ],
)
def test_every_spelling_of_this_machine_means_this_machine(written: str, host: str) -> None:
    target = normalize(written)
    assert (target.host, target.place) == (host, THIS_MACHINE), target
    assert is_loopback(written)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("written", "host", "place"),
    [  # strings only: none of these is reached by any test
        ("10.1", "10.0.0.1", PRIVATE),
        ("012.0.0.1", "10.0.0.1", PRIVATE),
        ("0xa000001", "10.0.0.1", PRIVATE),
        ("167772161", "10.0.0.1", PRIVATE),
        ("192.168.1", "192.168.0.1", PRIVATE),
        ("0xc0.0xa8.0.1", "192.168.0.1", PRIVATE),
        ("172.16.0.1", "172.16.0.1", PRIVATE),
        ("::ffff:10.0.0.1", "10.0.0.1", PRIVATE),
        ("64:ff9b::10.0.0.1", "10.0.0.1", PRIVATE),
        ("fd00::1", "fd00::1", PRIVATE),
        ("169.254.169.254", "169.254.169.254", LINK_LOCAL),
        ("0xa9fea9fe", "169.254.169.254", LINK_LOCAL),
        ("fe80::1%eth0", "fe80::1", LINK_LOCAL),
        ("localhost.example.com", "localhost.example.com", None),  # a name like any other
        ("example.com.", "example.com", None),
        ("Bücher.example", "xn--bcher-kva.example", None),
    ],
)
def test_other_places_are_named_too(written: str, host: str, place: str | None) -> None:
    target = normalize(written)
    assert (target.host, target.place) == (host, place), target
    assert not is_loopback(written)


@pytest.mark.fast
@pytest.mark.parametrize(
    "text",
    [
        "",
        "a b",
        "a\x00b",  # NUL
        "\x1b]0;owned\x07",  # an OSC sequence
        "evil\x1b[2J.example",  # CSI
        "line\nbreak",
        "\u202eexample.com",  # a bidi override
        "x:y",  # not IPv6, not a name
        "a" * 254,
        ("a" * 64) + ".example",  # a label over 63
        "256.1.1.1",  # looks like an address, is not one (and no DNS name ends in a number)
        "1.2.3.4.5",
        "-a.example",  # a label starts with a letter or digit
    ],
)
def test_what_is_no_host_name_is_refused(text: str) -> None:
    with pytest.raises(HostNameError):
        normalize(text)
    assert not is_loopback(text)


@pytest.mark.fast
def test_the_question_says_what_the_name_means_and_the_port() -> None:
    assert (
        cell_question("2130706433", 5432) == "Code in this cell wants to reach 127.0.0.1, this machine, "
        "written as 2130706433, port 5432"
    )
    assert cell_question("localhost", 8888) == "Code in this cell wants to reach localhost, this machine, port 8888"
    assert cell_question("api.example.com", 443) == "Code in this cell wants to reach api.example.com, port 443"
    assert cell_question("[::ffff:127.0.0.1]", 80, AGENT_QUESTION) == (
        "Code in run_python wants to reach 127.0.0.1, this machine, written as ::ffff:127.0.0.1, port 80"
    )
    assert "written as 0177.0.0.1" in cell_question("0177.0.0.1", None)


@pytest.mark.fast
def test_a_yes_on_this_machine_is_for_that_port_and_every_spelling_of_it() -> None:
    keys = {grant_key(normalize(spelling), 5432) for spelling in LOOPBACK_SPELLINGS if spelling != "0.0.0.0"}
    assert keys == {"127.0.0.1:5432"}
    assert grant_key(normalize("api.example.com"), 443) == "api.example.com"


@pytest.mark.fast
def test_the_allow_list_matches_what_a_name_means(tmp_path: Path) -> None:
    (tmp_path / ".ivralo").mkdir()
    entries = '["127.0.0.1:5432", "loopback:8080", "*.localhost:9000", "0x0a000001:22"]'
    (tmp_path / ".ivralo" / "permissions.json").write_text(f'{{"hosts": {{"allow": {entries}}}}}')
    policy = load_egress_policy(str(tmp_path), {"IVRALO_CONFIG_HOME": str(tmp_path / "home")})
    for spelling in ("127.1", "2130706433", "0x7f000001", "0177.0.0.1", "::ffff:127.0.0.1", "127.0.0.1."):
        assert policy.judge(spelling, 5432) == (True, "hosts.allow"), spelling
        assert policy.judge(spelling, 5433)[0] is None, spelling
    for spelling in (*LOOPBACK_SPELLINGS, "localhost.", "api.localhost", "::"):
        assert policy.judge(spelling, 8080) == (True, "hosts.allow"), spelling
    assert policy.judge("api.localhost", 9000)[0] is True and policy.judge("localhost", 9000)[0] is None
    assert policy.judge("10.0.0.1", 22)[0] is True, "an entry in another spelling is kept as its address"
    assert policy.judge("evil\x1b[2J", 5432) == (False, "the host name has characters no host name has")


@pytest.mark.fast
@pytest.mark.parametrize("spelling", LOOPBACK_SPELLINGS)
def test_the_desk_asks_each_spelling_as_this_machine(tmp_path: Path, spelling: str) -> None:
    """The host's desk, as the egress proxy calls it: the question names 127.0.0.1 (or 0.0.0.0),
    this machine, the spelling and the port; a "no" is a refusal."""
    from ivralo_kernel.host.sandbox.egress import EgressDesk

    asked: list[str] = []

    def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append(question)
        return "no"

    desk = EgressDesk(str(tmp_path), trusted=False, asker=ask)
    assert desk.decide(spelling.strip("[]"), 5432, None, None, lambda _on: None) == (False, "the person said no")
    meant = "0.0.0.0" if spelling == "0.0.0.0" else "127.0.0.1"
    written = "" if spelling == "0.0.0.0" else f", written as {spelling.strip('[]')}"
    note = untrusted_note(str(tmp_path))  # the folder is not trusted: what offers "always"
    assert asked == [f"Code in run_python wants to reach {meant}, this machine{written}, port 5432{note}"]


FETCH = "import urllib.request\nprint(urllib.request.urlopen('http://{host}:{port}/{path}', timeout=30).status)"
CURL = (
    "import subprocess\n"
    "print(subprocess.run(['sh', '-c', 'curl -sS http://{host}:{port}/{path}'], capture_output=True, text=True))"
)


@pytest.mark.parametrize("answer", ["no", None])
async def test_no_spelling_of_loopback_gets_through_without_a_yes(workspace: Path, answer: str | None) -> None:
    """A sandboxed kernel in a fresh folder: each spelling, from Python and from curl, is refused;
    asked as this machine with its port ("no"), or refused unasked (nobody to ask). The loopback
    server counts no hit."""
    from ivralo_kernel.host import Session, WorkerConfig

    asked: list[str] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append(question)
        return "no"

    with counting_http() as (port, hits):
        config = WorkerConfig(sandbox="required")
        async with Session(workspace=workspace, ask=ask if answer else None, config=config) as session:
            for n, spelling in enumerate(LOOPBACK_SPELLINGS):
                out = await session.run(FETCH.format(host=spelling, port=port, path=f"py{n}"))
                assert isinstance(out, dict) and "403" in out["error"], (spelling, out)
                out = await session.run(CURL.format(host=spelling, port=port, path=f"curl{n}"))
                assert "ivralo refused" in str(out), (spelling, out)
    assert hits == [], "no spelling of this machine got through without a yes"
    if answer is None:
        assert asked == []
    else:  # once per place and port: 0.0.0.0, then 127.0.0.1 (every other spelling is the same place)
        note = untrusted_note(os.path.realpath(workspace))
        assert asked == [
            f"Code in run_python wants to reach 0.0.0.0, this machine, port {port}{note}",
            f"Code in run_python wants to reach 127.0.0.1, this machine, written as 0177.0.0.1, port {port}{note}",
        ]


async def test_a_yes_reaches_what_was_asked_about_and_nothing_else(workspace: Path) -> None:
    """A yes to 2130706433 (asked as 127.0.0.1, port P) reaches 127.0.0.1:P; it is a yes for that port
    of this machine only: another port of it is asked about again."""
    from ivralo_kernel.host import Session, WorkerConfig

    asked: list[str] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append(question)
        return "yes" if not asked[1:] else "no"

    with counting_http() as (port, hits), counting_http() as (other, other_hits):
        async with Session(workspace=workspace, ask=ask, config=WorkerConfig(sandbox="required")) as session:
            first = await session.run(FETCH.format(host="2130706433", port=port, path="yes"))
            again = await session.run(FETCH.format(host="127.1", port=port, path="same-place"))
            elsewhere = await session.run(FETCH.format(host="2130706433", port=other, path="other-port"))
    assert hits == ["/yes", "/same-place"], (first, again)
    assert other_hits == [], elsewhere
    note = untrusted_note(os.path.realpath(workspace))
    assert asked == [
        f"Code in run_python wants to reach 127.0.0.1, this machine, written as 2130706433, port {port}{note}",
        f"Code in run_python wants to reach 127.0.0.1, this machine, written as 2130706433, port {other}{note}",
    ]


def _a_name_only_for_loopback() -> str:
    """This machine's own host name, where it resolves to loopback alone (as /etc/hosts has it on
    most machines); else the test is skipped: no other address is ever reached."""
    import socket

    name = socket.gethostname().lower()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    except OSError:
        pytest.skip(f"the host name {name!r} does not resolve here")
    if not addresses or not all(is_loopback(a) for a in addresses) or normalize(name).local:
        pytest.skip(f"the host name {name!r} resolves to {sorted(addresses)}, not loopback alone")
    return name


async def test_a_yes_to_a_name_that_points_at_this_machine_is_not_a_yes_to_this_machine(workspace: Path) -> None:
    """A name that looks like any other (here this machine's host name; a rebinding domain or
    ``127.0.0.1.nip.io`` alike) but resolves to loopback: the person said yes to the name, so the
    proxy refuses it, saying where it points; the person's own hosts.allow entry reaches it."""
    import json

    from ivralo_kernel.host import Session, WorkerConfig

    name = _a_name_only_for_loopback()

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        return "yes"

    with counting_http() as (port, hits):
        async with Session(workspace=workspace, ask=ask, config=WorkerConfig(sandbox="required")) as session:
            said = await session.run(FETCH.format(host=name, port=port, path="asked"))
        assert hits == [], said
        assert isinstance(said, dict) and "resolves to 127." in said["error"], said
        assert "this machine" in said["error"] and "which the question did not name" in said["error"], said
        (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": [f"{name}:{port}"]}}))
        async with Session(workspace=workspace, config=WorkerConfig(sandbox="required")) as session:
            said = await session.run(FETCH.format(host=name, port=port, path="listed"))
        assert hits == ["/listed"], said
