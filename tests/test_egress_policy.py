"""The host's egress policy: allow-list matching, and malformed files that fail closed with file,
line and field."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ivralo_kernel.host.sandbox.egress import allow_always, load_egress_policy

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)


def write(ws: Path, text: str) -> Path:
    path = ws / ".ivralo" / "permissions.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    config = tmp_path / "config-home"
    monkeypatch.setenv("IVRALO_CONFIG_HOME", str(config))
    return config


@pytest.mark.parametrize(
    ("host", "port", "verdict"),
    [
        ("api.example.com", 443, True),
        ("API.Example.COM.", 443, True),
        ("eu.data.example.org", 80, True),
        ("example.org", 80, None),  # "*.example.org" is subdomains only
        ("localhost", 8080, True),
        ("localhost", 8081, None),  # the entry names one port
        ("tracker.io", 443, None),
    ],
)
def test_allow_list_matching(workspace: Path, home: Path, host: str, port: int, verdict: bool | None) -> None:
    write(workspace, json.dumps({"hosts": {"allow": ["api.example.com", "*.example.org", "localhost:8080"]}}))
    assert load_egress_policy(str(workspace)).judge(host, port)[0] is verdict


def test_config_home_entries_count_too(workspace: Path, home: Path) -> None:
    home.mkdir()
    (home / "permissions.json").write_text(json.dumps({"hosts": {"allow": ["pypi.org"]}}))
    assert load_egress_policy(str(workspace)).judge("pypi.org", 443) == (True, "hosts.allow")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"hosts": {"allow": ["api.example.com",]}}', "line 1: not valid JSON"),
        ('{\n "hosts": {\n  "allow": "api.example.com"\n }\n}', 'line 3: field "hosts.allow" must be a list'),
        (
            '{\n "hosts": {\n  "allow": [\n   "ok.example.com",\n   "bad host"\n  ]\n }\n}',
            'line 5: field "hosts.allow"',
        ),
        ('{"hosts": {"allow": ["x.example.com:99999"]}}', "port that is not 1-65535"),
        ('["api.example.com"]', 'field "hosts" must be an object'),
    ],
)
def test_malformed_files_fail_closed_naming_file_line_and_field(
    workspace: Path, home: Path, text: str, problem: str
) -> None:
    path = write(workspace, text)
    policy = load_egress_policy(str(workspace))
    assert policy.closed
    allowed, reason = policy.judge("ok.example.com", 443)
    assert allowed is False, "fails closed: nothing is allowed until the file is fixed"
    assert str(path) in reason and problem in reason


def test_always_is_recorded_in_the_workspace(workspace: Path, home: Path) -> None:
    path = allow_always(str(workspace), "api.example.com")
    assert json.loads(path.read_text()) == {"hosts": {"allow": ["api.example.com"]}}
    assert load_egress_policy(str(workspace)).judge("api.example.com", 443)[0] is True


def test_the_loopback_keyword_allows_all_of_loopback_and_nothing_else(tmp_path: Path) -> None:
    from ivralo_kernel.protocol.network.egress import load_egress_policy

    (tmp_path / ".ivralo").mkdir()
    (tmp_path / ".ivralo" / "permissions.json").write_text('{"hosts": {"allow": ["loopback:8080"]}}')
    policy = load_egress_policy(str(tmp_path), {"IVRALO_CONFIG_HOME": str(tmp_path / "home")})
    for host in ("localhost", "api.localhost", "127.0.0.1", "127.3.2.1", "::1"):
        assert policy.judge(host, 8080) == (True, "hosts.allow"), host
        assert policy.judge(host, 8081)[0] is None, host
    for host in ("example.com", "localhost.example.com", "128.0.0.1", "::2"):  # strings only: nothing is reached
        assert policy.judge(host, 8080)[0] is None, host
    assert policy.connect_ports() == (8080,)


def settled(path: Path) -> None:
    """Until the file's stamp may be cached (its status older than SETTLED_NS), under a deadline."""
    from ivralo_kernel.host.settings.workspace_files import stamp

    deadline = time.monotonic() + 10
    while stamp(path) is False:
        assert time.monotonic() < deadline, f"{path}'s stamp never settled"
        time.sleep(0.01)


def test_a_cached_policy_and_digest_still_see_every_change(workspace: Path, home: Path) -> None:
    """The host reads permissions.json again only when its stamp moved (the proxy judges every
    request). A change the stamp could miss is still seen: the person's edit of the same size at
    once, and a rewrite that puts the mtime back (as code in a kernel can) sets the file aside."""
    from ivralo_kernel.host.sandbox.egress import EgressDesk
    from ivralo_kernel.host.settings.workspace_files import PERMISSIONS, WorkspaceFiles

    path = write(workspace, '{"hosts": {"allow": ["aaa.example.com"]}}')
    files = WorkspaceFiles(str(workspace))
    files.begin()  # noted, not protected: the kernel could write it (no sandbox)
    try:
        desk = EgressDesk(str(workspace), trusted=True, files=files)
        settled(path)
        assert desk.policy().judge("aaa.example.com", 443)[0] is True
        assert desk.policy() is desk.policy(), "an unchanged file is not parsed again"
        # The host's own write (an "always") is the noted content: used, and not set aside.
        with files.host_writes(PERMISSIONS):
            path.write_text('{"hosts": {"allow": ["bbb.example.com"]}}')  # the same size, in place
        assert desk.policy().judge("bbb.example.com", 443)[0] is True, "a change within the same tick is seen"
        assert desk.policy().judge("aaa.example.com", 443)[0] is None
        settled(path)
        assert desk.policy().judge("bbb.example.com", 443)[0] is True
        # Another writer (the kernel) rewrites it, the same size, and puts the old mtime back.
        before = path.stat()
        path.write_text('{"hosts": {"allow": ["ccc.example.com"]}}')
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
        assert desk.policy().judge("ccc.example.com", 443)[0] is None, "the kernel's rewrite is not used"
        assert desk.policy().judge("bbb.example.com", 443)[0] is None
        assert PERMISSIONS in files.ignored
    finally:
        files.end()
