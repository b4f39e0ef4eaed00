"""Property-based tests of host-side readers of kernel and workspace input (issue 30, Musts 2-3).

Each input is accepted, or refused with the reader's own clear error; never another exception."""

from __future__ import annotations

import contextlib
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


# --- the rest of the host's readers of kernel and workspace input (issue 30, Must 2) -------------------
# Each is driven directly (the host's own function or object, real inputs, nothing mocked); each input
# is accepted, or refused with the reader's own sentence; never another exception, never unbounded.

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", "photos.search", "db", "example.org", "127.0.0.1", "[::1]", "x" * 300, "select 1"]),
)
_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=10,
)
_file_bytes = st.one_of(
    _json_like,
    _values.map(lambda value: json.dumps(value).encode()),
    st.sampled_from(
        [b'{"size": 1e400}', b"[" * 5000 + b"]" * 5000, b'{"a": NaN, "b": Infinity}', b"\x00", b"{}\n" * 3]
    ),
)
_SHORT = 10.0  # seconds any one answer may take (a hang fails the example, never the run)


def _config_home(tmp_path) -> dict[str, str]:
    home = tmp_path / "config"
    home.mkdir(exist_ok=True)
    return {"IVRALO_CONFIG_HOME": str(home), "HOME": str(tmp_path)}


@pytest.fixture(scope="module")
def responder(tmp_path_factory):
    """One broker with an API operation (no credential: checked, never sent) and a SQLite database."""
    import sqlite3

    from ivralo_kernel.host.broker.responder import GRANT_DATABASES, BrokerResponder

    root = tmp_path_factory.mktemp("broker")
    workspace = root / "ws"
    workspace.mkdir()
    env = _config_home(root)
    db = root / "shop.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("create table t (a integer, b text)")
        conn.executemany("insert into t values (?, ?)", [(i, f"row {i}") for i in range(20)])
        conn.commit()
    env["SHOP_DB_URL"] = f"sqlite:///{db}"
    (root / "config" / "databases.json").write_text(json.dumps({"shop": {"url_env": "SHOP_DB_URL"}}))
    broker = BrokerResponder(str(workspace), trusted=True, grants=("photos", GRANT_DATABASES), env=env)
    yield broker
    broker.close()


_kinds = st.sampled_from(["egress", "egress_answer", "catalog", "api", "sql", "", "Egress", None, 1])
_payloads = st.one_of(
    _values,
    st.fixed_dictionaries(
        {"host": st.one_of(_hosts, _leaf), "port": st.one_of(st.integers(-5, 70_000), _leaf)},
    ),
    st.fixed_dictionaries(
        {"operation": st.sampled_from(["photos.search", "photos.x", "nope"]), "params": _values},
        optional={"extra": _leaf},
    ),
    st.fixed_dictionaries(
        {
            "operation": st.just("photos.search"),
            "params": st.dictionaries(
                st.sampled_from(["query", "page", "per_page", "orientation", "x"]), _leaf, max_size=4
            ),
        },
    ),
    st.fixed_dictionaries(
        {
            "database": st.sampled_from(["shop", "other", ""]),
            "query": st.one_of(
                st.sampled_from(["select * from t", "select a from t where a = :a", "delete from t", "select", "x"]),
                st.text(max_size=40),
                _leaf,
            ),
            "params": st.one_of(st.dictionaries(st.text(max_size=4), _leaf, max_size=3), _leaf),
        }
    ),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(req_id=st.one_of(st.just("r1"), _leaf), kind=_kinds, payload=_payloads, live=st.booleans())
def test_any_broker_request_is_answered_or_refused_with_a_sentence(responder, req_id, kind, payload, live) -> None:
    """The responder's validation of a request's kind and payload, as code in a kernel may forge it:
    an answer (an egress decision, the catalog, a call's result) or a refusal with a reason; never an
    exception, never the catch-all "the host's call failed" (an unforeseen error in a check)."""
    import threading
    import uuid

    answers: list[dict] = []
    got = threading.Event()

    def reply(answer) -> None:
        answers.append(dict(answer))
        got.set()

    request = {"req_id": req_id, "kind": kind, "payload": payload}
    responder.answer(request, uuid.uuid4().hex if live else None, reply, lambda _on: None)
    if not isinstance(req_id, str):
        assert not answers  # nothing to answer to
        return
    assert got.wait(_SHORT), f"no answer to {request!r}"
    (answer,) = answers
    if answer.get("ok"):
        assert "result" in answer
    elif "allowed" in answer and "ok" not in answer:  # an egress decision
        assert isinstance(answer["allowed"], bool) and isinstance(answer["reason"], str) and answer["reason"]
    else:
        text = answer.get("reason") or answer.get("error")
        assert isinstance(text, str) and text, answer
        assert "the host's call failed" not in text, answer


def test_broker_requests_per_execution_are_capped(responder) -> None:
    from ivralo_kernel.host.broker.responder import REQUESTS_PER_EXECUTION

    answers: list[dict] = []
    for _ in range(REQUESTS_PER_EXECUTION + 1):
        responder.answer({"req_id": "r", "kind": "catalog"}, "one-execution", answers.append, lambda _on: None)
    assert answers[-2]["ok"] and not answers[-1]["ok"]
    assert f"more than {REQUESTS_PER_EXECUTION} broker requests" in answers[-1]["reason"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=st.one_of(_hosts, st.text(max_size=300)), port=st.one_of(st.integers(-5, 10**9), _leaf))
def test_any_connect_target_is_judged_or_refused_with_a_sentence(tmp_path, host, port) -> None:
    """What the egress proxy does with a CONNECT's (or a URL's) host and port, and the broker's
    egress request: a decision with its reason (nobody to ask here: refused); the question a person
    would read is always a sentence."""
    from ivralo_kernel.host.sandbox.egress import EgressDesk, cell_question, valid_target

    desk = EgressDesk(str(tmp_path), trusted=True)
    target = valid_target({"host": host, "port": port})
    if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
        allowed, reason = desk.decide(host, port, None, None, lambda _on: None)
        assert isinstance(allowed, bool) and isinstance(reason, str) and reason
        assert not (allowed and target is None)
    if target is not None:
        assert cell_question(*target).startswith("Code in this cell wants to reach ")
    assert isinstance(cell_question(host, None), str)


_frame = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"<IDS|MSG>", b"{}", b'{"msg_type": "execute_request", "msg_id": "m"}']),
    _values.map(lambda value: json.dumps(value).encode()),
    st.builds(
        lambda t, m: json.dumps({"msg_type": t, "msg_id": m}).encode(),
        st.sampled_from(["execute_request", "execute_reply", "input_request", "input_reply", "x"]),
        st.sampled_from(["m", "", "q"]),
    ),
)
_message = st.lists(_frame, min_size=0, max_size=8)
_identities = st.lists(st.binary(min_size=0, max_size=6), max_size=2)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["client_request", "kernel_reply", "kernel_prompt", "client_reply"]), _identities, _message
        ),
        max_size=30,
    )
)
def test_any_stdin_traffic_is_taken_or_passed_on_and_stays_bounded(steps) -> None:
    """The relay's stdin bookkeeping (the person's egress answers travel there) against any frames a
    client or code in the kernel sends: never an exception; what it remembers stays capped."""
    from ivralo_kernel.host.sandbox import stdin_questions as sq

    questions = sq.StdinQuestions(b"key", "hmac-sha256")
    for step, identities, frames in steps:
        message = [*identities, sq.DELIMITER, *frames]
        split = sq.split(message)
        if split is None:
            continue
        ids, parts = split
        if step == "kernel_reply":
            questions.kernel_reply(parts)
        elif step == "kernel_prompt":
            questions.kernel_prompt(ids, parts)
        else:
            assert getattr(questions, step)(ids, parts) in (True, False)
        if questions.question("m", "Allow? [yes/no] ") is not None:
            questions.end_all()


def test_the_kernels_prompts_to_many_clients_stay_bounded() -> None:
    """Code in the kernel can send its own input_request to any routing identity it names: what the
    host remembers about them is capped, however many it names."""
    from ivralo_kernel.host.sandbox import stdin_questions as sq

    questions = sq.StdinQuestions(b"key", "hmac-sha256")
    request = json.dumps({"msg_type": "execute_request", "msg_id": "e"}).encode()
    assert questions.client_request([b"person"], [b"sig", request, b"{}", b"{}", b'{"allow_stdin": true}'])
    assert questions.question("e", "Allow? [yes/no] ") is not None  # the host's own, open at the person's client
    header = json.dumps({"msg_type": "input_request", "msg_id": "m"}).encode()
    for n in range(20_000):
        questions.kernel_prompt([b"client-%d" % n], [b"sig", header, b"{}", b"{}", b"{}"])
    assert len(questions._open) <= 1000  # sq.OPEN_CLIENTS_KEPT
    assert b"person" in questions._open  # a client with the host's question open is never forgotten
    assert all(len(waiting) <= sq.OPEN_PROMPTS_KEPT for waiting in questions._open.values())


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    typed=st.lists(
        st.one_of(st.none(), st.text(max_size=20), st.sampled_from(["y", "N", " always ", ""])), min_size=3, max_size=3
    )
)
def test_any_typed_answer_is_a_choice_or_nobody(typed) -> None:
    from ivralo_kernel.host.sandbox.person_question import ask_until_chosen

    answers = iter(typed)
    prompts: list[str] = []

    def ask(prompt: str):
        prompts.append(prompt)
        return next(answers)

    choice = ask_until_chosen(ask, "Code in this cell wants to reach example.org", ("yes", "no", "always"))
    assert choice in ("yes", "no", "always", None) and len(prompts) <= 3


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    notes=st.lists(
        st.tuples(
            st.sampled_from(["e1", "e2"]),
            st.text(max_size=20),
            st.integers(0, 65535),
            st.booleans(),
            st.text(max_size=20),
        ),
        max_size=40,
    )
)
def test_egress_notes_are_sent_once_and_answered(notes) -> None:
    """The proxy's notes to the kernel: each sent once per execution and outcome; the kernel's
    acknowledgement (any content) releases the wait."""
    from ivralo_kernel.host.sandbox.egress_notes import EgressNotes

    sent: list[dict] = []

    def send(note, on_reply) -> None:
        sent.append(dict(note))
        on_reply({"anything": [1, 2]})

    desk = EgressNotes(send)
    for execution, host, port, allowed, reason in notes:
        desk.note(execution, host, port, allowed, reason)()  # acknowledged: returns at once
    assert len(sent) <= len(notes)


def test_egress_notes_of_one_execution_stay_bounded() -> None:
    from ivralo_kernel.host.sandbox.egress_notes import EgressNotes

    desk = EgressNotes(lambda _note, on_reply: on_reply({}))
    for n in range(20_000):  # a cell's loop over many hosts, each refused by the proxy
        desk.note("one cell", f"h{n}.example", 443, False, "refused")()
    assert len(desk._sent) <= 5000  # egress_notes.MAX_NOTES_KEPT


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.one_of(
        st.text(max_size=60),
        st.sampled_from(["stage:", "kill-now", "kill-at:e:off", "kill-at:e:nan", "kill-at::1e999"]),
    )
)
def test_any_pipe_line_is_one_of_the_supervisors_or_none(text: str) -> None:
    from ivralo_kernel.protocol import pipe

    decoded = pipe.decode(text)
    assert decoded is None or isinstance(decoded, pipe.Stage | pipe.KillAt | pipe.KillNow)
    if decoded is not None:
        assert pipe.decode(pipe.encode(decoded).decode().rstrip("\n")) is not None


class _ExitedBwrap:
    """What SandboxStart.wait reads of the bwrap it launched, when bwrap exited: its status, and
    its stderr through a real pipe (fast tests start no process)."""

    pid = -1

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        os.write(write_fd, b"bwrap: no\n")
        os.close(write_fd)
        self.stderr = os.fdopen(read_fd, "rb")

    def wait(self, timeout: float | None = None) -> int:
        return 0


def _spent_process() -> _ExitedBwrap:
    return _ExitedBwrap()


@settings(max_examples=max(20, EXAMPLES // 6), deadline=None)
@given(
    said=st.one_of(st.binary(max_size=600), st.sampled_from([b"stage:sandbox-built\n", b"stage:sandbox-built", b"\n"]))
)
def test_any_sandbox_built_pipe_is_read_or_named(said: bytes) -> None:
    """The supervisor's "sandbox built" line, as any bytes: None (built), or bubblewrap's own words."""
    from ivralo_kernel.host.sandbox.launch import SandboxStart

    start, process = SandboxStart(), _spent_process()
    try:
        os.write(start.write_fd, said)
        why = start.wait(process, "bwrap", timeout=_SHORT)
    finally:
        start.close()
        process.stderr.close()
    assert why is None or why.startswith("bubblewrap (bwrap) exited with status 0 without building the sandbox")


def test_a_sandbox_built_pipe_without_a_newline_is_read_no_further_than_a_line() -> None:
    """A writer that never ends its line (and never closes): the host reads a bounded amount, then says why."""
    import threading

    from ivralo_kernel.host.sandbox import launch

    start, process = launch.SandboxStart(), _spent_process()
    writer_fd = os.dup(start.write_fd)  # kept open by the writer: no EOF ends the read
    written = [0]

    def flood() -> None:
        with contextlib.suppress(OSError):
            while written[0] < 64 << 20:
                written[0] += os.write(writer_fd, b"x" * 65536)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        why = start.wait(process, "bwrap", timeout=_SHORT)
    finally:
        start.close()  # the writer's next write fails: it stops
        thread.join(_SHORT)
        os.close(writer_fd)
        process.stderr.close()
    assert not thread.is_alive()
    assert why is not None and "without building the sandbox" in why
    assert written[0] < 64 << 20, "the host read all the writer gave"


class _Stream:
    """The host's own stdout, as kernel_output writes to it: what it got, and its longest write."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=600))
def test_any_kernel_output_reaches_the_host_as_printable_text(data: bytes) -> None:
    """What a kernel's tree writes to its stdout/stderr pipe, passed on: text with no control
    character but tab and newline (no escape sequence reaches the person's terminal)."""
    from ivralo_kernel.host.sandbox.kernel_output import _copy_lines

    read_fd, write_fd = os.pipe()
    os.write(write_fd, data)
    os.close(write_fd)
    target = _Stream()
    _copy_lines(os.fdopen(read_fd, "rb"), target)
    text = "".join(target.parts)
    assert all(ch in "\t\n" or (ord(ch) >= 32 and ord(ch) != 127) for ch in text), text
    assert text.count("\n") == data.count(b"\n")
    assert bool(text) == bool(data)


def test_a_kernel_output_line_without_end_is_passed_on_in_bounded_parts() -> None:
    """A kernel that writes megabytes without a newline: the host passes them on piece by piece,
    never holding the whole line."""
    import threading

    from ivralo_kernel.host.sandbox.kernel_output import _copy_lines

    read_fd, write_fd = os.pipe()

    def flood() -> None:
        with os.fdopen(write_fd, "wb") as pipe:
            for _ in range(128):
                pipe.write(b"y" * 65536)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    target = _Stream()
    _copy_lines(os.fdopen(read_fd, "rb"), target)
    thread.join(_SHORT)
    assert sum(map(len, target.parts)) == 128 * 65536
    assert max(map(len, target.parts)) <= 1 << 20
