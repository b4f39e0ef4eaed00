"""Property-based tests of host-side readers of kernel and workspace input (issue 30, Musts 2-3).

Each input is accepted, or refused with the reader's own clear error; never another exception."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ivralo_kernel.host.sandbox.plan import dotenv_for_kernel, dotenv_kept_out, dotenv_set_aside
from ivralo_kernel.host.settings.file_problems import WHAT_TO_DO, settings_file_lines
from ivralo_kernel.protocol import database_env_names
from ivralo_kernel.protocol.network.egress import load_egress_policy
from ivralo_kernel.protocol.network.proxying import BadRequest, parse_head

EXAMPLES = 100 if os.environ.get("CI") == "true" else 300
pytestmark = pytest.mark.fast

_methods = st.sampled_from(["CONNECT", "GET", "POST", "get", "X1", ""])
_hosts = st.one_of(
    st.sampled_from(["example.org", "[::1", "[::1]", "127.0.0.1", "", "a..b", "[zz]", "xn--", "h\x00"]),
    st.text(max_size=40),
)
_ports = st.one_of(st.integers(-5, 10**9).map(str), st.text(max_size=8))


@settings(max_examples=EXAMPLES, deadline=None)
@given(method=_methods, host=_hosts, port=_ports, scheme=st.sampled_from(["http://", "https://", "", "ftp://"]))
def test_a_proxy_head_is_parsed_or_refused_with_a_sentence(method: str, host: str, port: str, scheme: str) -> None:
    target = f"{host}:{port}" if method == "CONNECT" else f"{scheme}{host}:{port}/p"
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode("utf-8", "surrogatepass")
    try:
        request = parse_head(head)
    except BadRequest as exc:
        assert str(exc)
        return
    assert 0 < request.port < 65536
    request.origin_head()  # never raises for an accepted request


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_as_a_proxy_head_are_parsed_or_refused(data: bytes) -> None:
    try:
        parse_head(data + b"\r\n\r\n").origin_head()
    except BadRequest as exc:
        assert str(exc)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_any_dotenv_is_read_or_set_aside_with_a_line(tmp_path, data: bytes) -> None:
    (tmp_path / ".env").write_bytes(data)
    line = dotenv_set_aside(str(tmp_path))
    values = dotenv_for_kernel(str(tmp_path), {})
    dotenv_kept_out(str(tmp_path), {})
    if line is not None:
        assert ".env was set aside: line " in line and values == {}
    for name, value in values.items():
        assert "\0" not in name and "\0" not in value


def test_a_dotenv_with_a_nul_byte_is_set_aside_naming_its_line(tmp_path) -> None:
    (tmp_path / ".env").write_bytes(b"A=1\nB=x\x00y\n")
    line = dotenv_set_aside(str(tmp_path))
    assert line is not None and "line 2" in line and "NUL" in line
    assert dotenv_for_kernel(str(tmp_path), {}) == {}


_json_like = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
        max_leaves=12,
    ).map(lambda value: json.dumps(value).encode()),
    st.sampled_from([b"[" * 100_000, b'{"hosts": {"allow": [1, "", "a:b:c", "::1", "x" ]}}', b"\xef\xbb\xbf{}"]),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_json_like, hosts_shape=st.booleans())
def test_any_settings_file_is_read_or_named_with_a_line(tmp_path, data: bytes, hosts_shape: bool) -> None:
    """permissions.json and databases.json, as code in the kernel may leave them: read, or a
    sentence naming the file (what the banner shows); never another exception."""
    if hosts_shape and data.startswith(b"{") and len(data) < 200:
        data = b'{"hosts": {"allow": ' + data + b"}}"
    state = tmp_path / ".ivralo"
    state.mkdir(exist_ok=True)
    (state / "permissions.json").write_bytes(data)
    (tmp_path / "databases.json").write_bytes(data)
    _, problems = database_env_names(str(tmp_path), {})
    lines = settings_file_lines(str(tmp_path), problems, permissions_usable=True)
    for line in lines:
        assert str(tmp_path) in line and line.endswith(WHAT_TO_DO), line
    load_egress_policy(str(tmp_path), {}).judge("example.org", 443)
