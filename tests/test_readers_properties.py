"""Property-based tests of host-side readers of kernel and workspace input (issue 30, Musts 2-3).

Each input is accepted, or refused with the reader's own clear error; never another exception."""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from hypothesis import HealthCheck, event, example, given, settings
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


def _mostly(valid, other=_leaf):
    """Mostly a valid field (so that the checks after it are reached), sometimes anything."""
    return st.integers(0, 9).flatmap(lambda n: valid if n else other)


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
_egress_payloads = st.fixed_dictionaries(
    {
        "host": _mostly(st.one_of(_hosts, st.sampled_from(["example.org", "localhost", "10.0.0.1"]))),
        "port": _mostly(st.integers(-5, 70_000)),
    }
)
_api_payloads = st.fixed_dictionaries(
    {
        "operation": _mostly(st.sampled_from(["photos.search", "photos.x", "nope"])),
        "params": _mostly(
            st.dictionaries(
                st.sampled_from(["query", "page", "per_page", "orientation", "x"]),
                _mostly(st.one_of(st.integers(-3, 1200), st.sampled_from(["cats", "landscape", "", "x" * 300]))),
                max_size=4,
            ),
            _values,
        ),
    },
    optional={"extra": _leaf},
)
_sql_payloads = st.fixed_dictionaries(
    {
        "database": _mostly(st.sampled_from(["shop", "shop", "other", ""])),
        "query": _mostly(
            st.sampled_from(
                [
                    "select * from t",
                    "select a, b from t where a = :a",
                    "select b from t where b = :b",
                    "delete from t",
                    "select",
                    "attach database 'x' as y",
                    "select zeroblob(100000000)",
                    "with recursive c(x) as (select 1 union all select x + 1 from c) select x from c",
                ]
            ),
            st.one_of(st.text(max_size=40), _leaf),
        ),
        "params": _mostly(st.dictionaries(st.sampled_from(["a", "b", ""]), _leaf, max_size=2), _values),
    }
)
_requests = st.one_of(
    st.tuples(st.just("egress"), _egress_payloads),
    st.tuples(st.just("api"), _api_payloads),
    st.tuples(st.just("sql"), _sql_payloads),
    st.tuples(_kinds, _values),
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(req_id=_mostly(st.just("r1")), request=_requests, live=_mostly(st.just(True), st.just(False)))
def test_any_broker_request_is_answered_or_refused_with_a_sentence(responder, req_id, request, live) -> None:
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

    kind, payload = request
    request = {"req_id": req_id, "kind": kind, "payload": payload}
    responder.answer(request, uuid.uuid4().hex if live else None, reply, lambda _on: None)
    if not isinstance(req_id, str):
        assert not answers  # nothing to answer to
        return
    assert got.wait(_SHORT), f"no answer to {request!r}"
    (answer,) = answers
    reason = str(answer.get("reason") or answer.get("error") or "")
    event(f"{kind}: " + ("answered" if answer.get("ok") else f"refused ({reason[:30]}...)"))
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
    st.sampled_from([b"<IDS|MSG>", b"{}", b'{"msg_type": "execute_request", "msg_id": "m"}', b'{"allow_stdin": true}']),
    _values.map(lambda value: json.dumps(value).encode()),
    st.builds(
        lambda t, m: json.dumps({"msg_type": t, "msg_id": m}).encode(),
        st.sampled_from(["execute_request", "execute_reply", "input_request", "input_reply", "x"]),
        st.sampled_from(["m", "", "q"]),
    ),
)
_message = st.one_of(
    st.lists(_frame, min_size=0, max_size=8),
    st.just([b"sig", b'{"msg_type": "execute_request", "msg_id": "m"}', b"{}", b"{}", b'{"allow_stdin": true}']),
)
_identities = st.lists(st.binary(min_size=0, max_size=6), max_size=2)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["client_request", "kernel_reply", "kernel_prompt", "client_reply"]), _identities, _message
        ),
        max_size=16,
    ),
    value=st.one_of(
        st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.lists(st.text(max_size=3), max_size=2)
    ),
)
def test_any_stdin_traffic_is_taken_or_passed_on_and_stays_bounded(steps, value) -> None:
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
    asked = questions.question("m", "Allow? [yes/no] ")  # an execute_request "m" a client sent, still running
    event("the host asked" if asked is not None else "nobody to ask")
    if asked is not None:  # the client's signed answer, any value in it: the host's, a string
        question, frames = asked
        client = sq.Session(key=b"key", signature_scheme="hmac-sha256")
        parent = json.loads(frames[frames.index(sq.DELIMITER) + 2])
        reply = client.serialize(client.msg("input_reply", {"value": value}, parent=parent), ident=[question.client])
        ids, parts = sq.split(reply)
        assert questions.client_reply(ids, parts) is True
        assert question.answered.is_set() and isinstance(question.value, str)
        assert question.value == (value if isinstance(value, str) else "")
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


def _npy(array) -> bytes:
    import io

    import numpy

    buffer = io.BytesIO()
    numpy.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _arrow(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _mutated(data: bytes, at: list[tuple[int, int]], cut: int | None) -> bytes:
    """``data`` with some bytes replaced and maybe cut short: what code in the kernel may leave."""
    out = bytearray(data)
    for position, value in at:
        if out:
            out[position % len(out)] = value
    return bytes(out[:cut] if cut is not None else out)


_edits = st.one_of(st.just([]), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4))
_cuts = st.one_of(st.none(), st.integers(0, 2_000))
_raw = st.one_of(st.none(), st.none(), st.binary(max_size=300))


def _npy_seeds() -> list[bytes]:
    import numpy

    return [
        _npy(numpy.arange(12, dtype="int64").reshape(3, 4)),
        _npy(numpy.zeros((2, 3), dtype="float32", order="F")),
        _npy(numpy.array(["a", "bc"])),
        _npy(numpy.zeros((0,), dtype="V0")) if hasattr(numpy, "void") else b"",
        b"\x93NUMPY\x01\x00v\x00{'descr': '<i8', 'fortran_order': False, 'shape': (99999999999, 99999999999), }"
        + b" " * 40
        + b"\n",
        b"\x93NUMPY\x01\x00v\x00{'descr': 'V0', 'fortran_order': False, 'shape': (99999999999,), }" + b" " * 50 + b"\n",
        b"\x93NUMPY\x02\x00\xff\xff\xff\xff{",
        b"\x93NUMPY\x03\x00\x10\x00\x00\x00{}",
    ]


def _arrow_seeds() -> list[bytes]:
    import pyarrow as pa

    return [
        _arrow(pa.table({"a": [1, 2, 3], "b": ["x", "yy", None]})),
        _arrow(pa.table({"d": pa.array(["p", "q", "p"]).dictionary_encode(), "l": [[1], [], [2, 3]]})),
        _arrow(pa.table({"t": pa.array([1, 2], pa.timestamp("ns", "UTC")), "s": [{"k": 1}, {"k": 2}]})),
    ]


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    seed=st.integers(0, 7),
    raw=_raw,
    edits=_edits,
    cut=_cuts,
    version=st.sampled_from([b"", b"\x01\x00", b"\x02\x00", b"\x03\x00"]),
)
def test_any_npy_from_the_kernel_is_read_or_refused_with_a_sentence(seed, raw, edits, cut, version) -> None:
    """get_var of an array: the segment's bytes, whatever code in the kernel wrote there."""
    from ivralo_kernel.host.agent.dataplane import decode_segment
    from ivralo_kernel.protocol.errors import IvraloError

    seeds = _npy_seeds()
    data = raw if raw is not None else _mutated(seeds[seed % len(seeds)], edits, cut)
    if version and raw is not None:
        data = b"\x93NUMPY" + version + data
    try:
        array = decode_segment({"kind": "npy"}, data, len(data))
    except IvraloError as exc:
        assert str(exc)
        event("refused")
        return
    event("read")
    assert not array.dtype.hasobject and array.nbytes <= len(data)


_AS = st.sampled_from(["pandas.DataFrame", "pandas.Series", "pyarrow.ChunkedArray", "pyarrow.Table", None, 3])


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2), raw=_raw, edits=_edits, cut=_cuts, kind=_AS)
@example(seed=1, raw=None, edits=[(88, 128)], cut=None, kind="pandas.DataFrame")  # a field name not UTF-8
def test_any_arrow_from_the_kernel_is_converted_or_refused_with_a_sentence(seed, raw, edits, cut, kind) -> None:
    """get_dataframe: an Arrow IPC stream the kernel wrote, whole, mutated or cut short; validated
    in full before it is converted (an offset out of order once crashed the host)."""
    from ivralo_kernel.host.agent.dataplane import decode_segment
    from ivralo_kernel.protocol.errors import IvraloError

    seeds = _arrow_seeds()
    data = raw if raw is not None else _mutated(seeds[seed], edits, cut)
    try:
        decode_segment({"kind": "arrow", "as": kind}, bytearray(data), len(data))
        event("converted")
    except IvraloError as exc:
        assert str(exc)
        event("refused")


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    text=st.one_of(_file_bytes.map(lambda b: b.decode("utf-8", "replace")), _leaf),
    kind=st.sampled_from(["json", "repr"]),
)
def test_any_inline_value_or_answer_from_the_kernel_is_read_or_refused(text, kind) -> None:
    """get_var's inline JSON, and the JSON answers of the data plane's steps (the envelope, what it
    wrote): a value, or the data plane's refusal."""
    from ivralo_kernel.host.agent.dataplane import TransferRefusedError, checked_size, decode_inline, kernel_json

    try:
        decode_inline({"kind": kind, "text": text})
    except TransferRefusedError as exc:
        assert str(exc)
    try:
        answer = kernel_json("get_var", text)
        checked_size("get_var", answer, "size", 1 << 20, "the test's cap")
    except TransferRefusedError as exc:
        assert str(exc).startswith("get_var: ")


_start_failure_fields = st.fixed_dictionaries(
    {"at": _leaf, "message": _leaf, "last_stage": _values, "stderr_tail": _values},
    optional={"time": _leaf, "pid": _leaf, "stages": _values},
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.one_of(_start_failure_fields.map(lambda e: json.dumps(e).encode()), _file_bytes, st.binary(max_size=80)),
        max_size=5,
    )
)
def test_any_worker_log_is_read_or_its_lines_skipped(tmp_path, lines) -> None:
    """.ivralo/python-worker.log is writable from inside the sandbox: the host's WorkerBootstrapError
    reads its newest entry, or says there is none; never another exception."""
    from ivralo_kernel.protocol import names
    from ivralo_kernel.protocol.worker_log import last_start_failure

    log = tmp_path / names.WORKER_LOG
    log.parent.mkdir(exist_ok=True)
    log.write_bytes(b"\n".join(lines))
    stage, tail = last_start_failure(log, since=0.0)
    assert isinstance(stage, str) and isinstance(tail, str) and len(tail) <= 600


def test_a_huge_worker_log_is_read_from_its_end_only(tmp_path) -> None:
    """Code in the kernel can make the log any size: the host reads a bounded tail (the newest entry)."""
    import tracemalloc

    from ivralo_kernel.protocol import names, worker_log

    log = tmp_path / names.WORKER_LOG
    log.parent.mkdir()
    with open(log, "wb") as f:
        f.write((b"x" * 1023 + b"\n") * (48 << 10))  # 48 MiB of lines that are no entry
    worker_log.append(log, worker_log.start_failure("it exited", ["imports"], "Traceback: boom\n"))
    tracemalloc.start()
    try:
        stage, tail = worker_log.last_start_failure(log, since=0.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (stage, tail) == ("imports", "Traceback: boom")
    assert peak < 16 << 20, f"the host held {peak} bytes to read the log"


_param_specs = st.fixed_dictionaries(
    {"type": _mostly(st.sampled_from(["string", "integer", "number", "boolean"]))},
    optional={
        "required": _mostly(st.booleans()),
        "max_length": _mostly(st.integers(0, 50)),
        "minimum": _mostly(st.integers(-5, 5)),
        "maximum": _mostly(st.integers(-5, 5)),
        "choices": _mostly(st.lists(_leaf, max_size=3), _values),
    },
)
_operation_specs = st.fixed_dictionaries(
    {
        "url": _mostly(st.sampled_from(["https://api.example.org/v1/", "https://api.example.org/{id}", "ftp://x"])),
        "credential": _mostly(st.just("EXAMPLE_KEY")),
    },
    optional={
        "auth": _mostly(
            st.fixed_dictionaries(
                {"kind": _mostly(st.sampled_from(["header", "bearer", "query"]), _values)},
                optional={"name": _mostly(st.just("X-Key")), "format": _mostly(st.just("Key {credential}"))},
            )
        ),
        "params": _mostly(st.dictionaries(st.sampled_from(["id", "q", "n"]), _param_specs, max_size=3)),
        "method": _mostly(st.sampled_from(["GET", "post", "PUT"])),
        "body": _mostly(st.sampled_from(["json", "query"])),
        "max_response_bytes": _mostly(st.integers(1, 1 << 20)),
        "timeout_s": _mostly(st.floats(0.1, 30)),
        "grant": _mostly(st.just("ex")),
        "description": _mostly(st.text(max_size=10)),
    },
)


_ONE_PARAM = b'{"operations": {"ex.get": {"url": "https://x/", "credential": "K", "params": {"n": {"type": "integer", '


@example(data=_ONE_PARAM + b'"minimum": "a"}}}}}', params={"n": 5})  # a bound that is no number
@example(data=_ONE_PARAM + b'"max_length": Infinity}}}}}', params={})  # json takes Infinity
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=_mostly(
        st.dictionaries(
            _mostly(st.just("ex.get"), st.sampled_from(["Bad", "ex.put"])), _operation_specs, max_size=2
        ).map(lambda ops: json.dumps({"operations": ops}).encode()),
        _file_bytes,
    ),
    params=st.dictionaries(
        st.sampled_from(["id", "q", "n", "z"]), _mostly(st.one_of(st.integers(-9, 9), st.text(max_size=5))), max_size=3
    ),
)
def test_any_apis_json_is_read_or_named_and_its_operations_check_any_params(tmp_path, data, params) -> None:
    """apis.json in the config home: each operation is taken, or a problem names the file and field;
    a taken operation checks any parameters code sends with its own refusal, and builds its request."""
    from ivralo_kernel.host.broker.operations import OperationError, load_operations

    env = _config_home(tmp_path)
    (tmp_path / "config" / "apis.json").write_bytes(data)
    operations, problems = load_operations(env)
    assert all(isinstance(p, str) and p for p in problems)
    event(f"operations taken: {len(operations) - 1}, problems: {min(len(problems), 2)}")
    for operation in operations.values():
        operation.signature()
        try:
            checked = operation.check(params)
        except OperationError as exc:
            assert str(exc).startswith(operation.name)
            continue
        operation.request(checked, "secret-value")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.one_of(
        _file_bytes,
        st.fixed_dictionaries({}, optional={"remove": _values, "keep": _values}).map(lambda r: json.dumps(r).encode()),
    ),
    passed_on=st.one_of(st.none(), st.text(max_size=40), st.just("[" * 5000)),
)
def test_any_environment_json_is_read_or_named(tmp_path, data, passed_on) -> None:
    """environment.json (the person's scrub rule) in the config home, or the rule a host passed on."""
    from ivralo_kernel.protocol import names
    from ivralo_kernel.protocol.credentials import ScrubRule, rule_problems

    env = _config_home(tmp_path)
    rule_file = tmp_path / "config" / "environment.json"
    if passed_on is not None:  # read only when there is no file
        env[names.ENV_SCRUB_RULE] = passed_on
        rule_file.unlink(missing_ok=True)
    else:
        rule_file.write_bytes(data)
    rule = ScrubRule.load(env)
    assert all(isinstance(p, str) and p for p in rule_problems(env))
    rule.removes("GITHUB_TOKEN")
    rule.keeps("PATH")


_index_lines = st.fixed_dictionaries(
    {"copy": st.one_of(st.just("20261201-101010-000000001-notes.txt"), _leaf), "path": _leaf},
    optional={"time": _leaf, "ns": _leaf, "operation": _leaf, "size": _leaf, "restored": _leaf},
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(
        st.one_of(_index_lines.map(json.dumps), _file_bytes.map(lambda b: b.decode("utf-8", "replace"))), max_size=6
    )
)
def test_any_history_index_is_read_or_its_lines_skipped(tmp_path, lines) -> None:
    """.ivralo/history/index.jsonl, written from the kernel's side: the host's reader takes the lines
    that are entries and skips the rest; the recorder records only what it can check."""
    from ivralo_kernel.host.history.ledger import HistoryRecorder, read_index
    from ivralo_kernel.protocol import names

    workspace = tmp_path / "ws"
    history = workspace / names.HISTORY_DIR
    history.mkdir(parents=True, exist_ok=True)
    recorder = HistoryRecorder(str(workspace), env=_config_home(tmp_path))
    (history / "20261201-101010-000000001-notes.txt").write_text("old")
    (history / "index.jsonl").write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
    for entry in read_index(str(history)):
        assert isinstance(entry.ns, int) and isinstance(entry.size, int) and isinstance(entry.path, str)
    recorder.record()
    recorder.close()


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    lines=st.lists(
        st.one_of(
            st.sampled_from([b"stage:imports", b"kill-now", b"kill-at:e:off", b"kill-at:e:12.5", b""]),
            st.binary(max_size=40),
            st.integers(4000, 9000).map(lambda n: b"stage:" + b"x" * n),
        ),
        max_size=8,
    ),
    cuts=st.lists(st.integers(1, 5000), max_size=6),
)
def test_any_pipe_lines_in_any_chunks_are_read_as_whole_lines_only(lines, cuts) -> None:
    """The supervisor's reader of the kernel's stage pipe and the host's pipe: however the bytes are
    split into reads, the same lines come out (one longer than MAX_LINE dropped), nothing else."""
    from ivralo_kernel.protocol import pipe

    data = b"".join(line + b"\n" for line in lines)
    expected = [m for line in lines if len(line) <= pipe.MAX_LINE and (m := pipe.decode(line.decode(errors="replace")))]
    reader, found, at = pipe.LineReader(), [], 0
    for size in [*cuts, len(data)]:
        found += reader.feed(data[at : at + size])
        at += size
        assert len(reader.pending) <= pipe.MAX_LINE
    assert found == expected


def test_a_pipe_line_without_end_is_held_no_further_than_a_line() -> None:
    from ivralo_kernel.protocol import pipe

    reader = pipe.LineReader()
    for _ in range(4096):  # 16 MiB of one stage line that never ends, read 4 KiB at a time
        assert reader.feed(b"s" * 4096) == []
        assert len(reader.pending) <= pipe.MAX_LINE
    assert reader.feed(b"\nstage:imports\n") == [pipe.Stage("imports")]


def test_the_brokers_counts_of_executions_stay_bounded(responder) -> None:
    """Each execution's requests are counted (a cap per execution); a kernel that runs cells for
    weeks does not grow the host's table of them."""
    for n in range(5000):
        responder.answer({"req_id": "r", "kind": "catalog"}, f"execution-{n}", lambda _answer: None, lambda _on: None)
    assert len(responder._counts) <= 1000  # responder.EXECUTIONS_COUNTED


@pytest.fixture(scope="module")
def watchdog(responder):
    """A host's watchdog of no kernel, never started: its handler of the kernel's IOPub messages is
    driven directly (the broker behind it is the responder above)."""
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket
    from ivralo_kernel.host.watch.watchdog import Watchdog, WatchdogSettings

    dog = Watchdog(
        {"key": "key", "signature_scheme": "hmac-sha256"},
        os.getpid(),
        WatchdogSettings(),
        lambda: None,
        broker=responder,
        comm_id="broker-comm",
        broker_socket=BrokerSocket(),
    )
    yield dog
    dog.channels.close()
    assert dog.broker is not None
    dog.broker.socket.close()


_ids = _mostly(st.sampled_from(["m", "e1", ""]))
_small = st.one_of(_leaf, st.lists(_leaf, max_size=2), st.dictionaries(st.text(max_size=4), _leaf, max_size=2))
_headers = _mostly(
    st.fixed_dictionaries(
        {
            "msg_id": _mostly(st.just("h1"), _leaf),
            "msg_type": _mostly(st.sampled_from(["comm_msg", "status", "stream"])),
        },
        optional={"date": _mostly(st.just("2026-12-02T10:00:00.000000Z")), "session": _leaf, "version": _leaf},
    ),
    _small,
)
_parents = _mostly(
    st.fixed_dictionaries({}, optional={"msg_id": _ids, "msg_type": _mostly(st.just("execute_request"))}),
)
_contents = _mostly(
    st.fixed_dictionaries(
        {},
        optional={
            "comm_id": _mostly(st.just("broker-comm")),
            "data": _mostly(
                st.fixed_dictionaries({"req_id": _mostly(st.just("r")), "kind": _kinds, "payload": _small}), _small
            ),
            "execution_state": st.one_of(st.sampled_from(["busy", "idle", "starting"]), _leaf),
        },
    ),
    _small,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    parts=st.lists(
        st.tuples(_headers, _parents, _mostly(st.just({}), _small), _contents).map(
            lambda p: [json.dumps(x).encode() for x in p]
        ),
        min_size=1,
        max_size=3,
    ),
    deep=_mostly(st.just(False), st.just(True)),
    signed=_mostly(st.just(True), st.just(False)),
)
def test_any_message_on_the_kernels_iopub_is_handled_or_dropped(watchdog, parts, deep, signed) -> None:
    """What the watchdog's thread reads from the kernel's IOPub (a broker request, a status, any
    other), signed with the kernel's key, which code in the kernel can read: each is a well-formed
    message that the watchdog handles, or dropped; never an error (the watchdog's thread would end,
    and with it the host's deadlines)."""
    from jupyter_client.session import Session

    from ivralo_kernel.host.watch.kernel_channels import message_of

    session = Session(key=b"key", signature_scheme="hmac-sha256")
    watchdog.channels.session.digest_history.clear()  # examples repeat messages; a kernel's msg_ids do not
    for frames in parts:
        if deep:
            frames[3] = b"[" * 5000 + b"]" * 5000
        signature = session.sign(frames) if signed else b"0" * 64
        channels = watchdog.channels  # as its IOPub drain reads them: bytes, only the types it acts on
        msg = message_of(channels.session, [b"<IDS|MSG>", signature, *frames], channels.iopub_types)
        if msg is None:
            continue
        assert isinstance(msg["content"], dict) and isinstance(msg["header"]["msg_type"], str)
        event(f"handled: {msg['header']['msg_type']}")
        watchdog._on_iopub(msg)
    assert len(watchdog.running) <= 1000


def _finite(frame: object) -> bool:
    try:
        json.dumps(frame, allow_nan=False)
    except ValueError:
        return False
    return True


_frames = st.one_of(
    st.fixed_dictionaries(
        {
            "req_id": _mostly(st.just("r")),
            "kind": _kinds,
            "payload": _small,
            "parent": _mostly(st.sampled_from(["h1", "e1"])),
        }
    ),
    _small,
)


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    frames=st.lists(_frames.filter(_finite), max_size=4),
    junk=_mostly(st.just(b""), st.binary(max_size=12)),
    cuts=st.lists(st.integers(1, 64), max_size=4),
)
def test_any_bytes_on_the_broker_socket_are_answered_or_dropped(watchdog, frames, junk, cuts) -> None:
    """What code in the kernel writes on its end of the broker's socket (requests naming any
    execution, anything else, bytes that are no frame, in any pieces): each request is answered, now
    or once its hold ends, or dropped; never an error on the watchdog's thread, and nothing is held
    past the hold."""
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket
    from ivralo_kernel.protocol import broker_frames

    assert watchdog.broker is not None
    original = watchdog.broker.socket
    sock = watchdog.broker.socket = BrokerSocket()
    kernel_end = sock._kernel
    assert kernel_end is not None
    try:
        data = b"".join(broker_frames.encode(frame) for frame in frames) + junk
        at = 0
        for size in [*cuts, len(data)]:
            kernel_end.sendall(data[at : at + size])
            at += size
            watchdog._on_broker_socket()
        watchdog.broker.expire(float("inf"), watchdog._running_execution, watchdog._pause_deadline)
        assert watchdog.broker.wakeup() is None
        kernel_end.setblocking(False)
        answers = broker_frames.FrameReader(broker_frames.MAX_ANSWER_BYTES)
        with contextlib.suppress(BlockingIOError):
            while chunk := kernel_end.recv(1 << 16):
                for answer in answers.feed(chunk):
                    assert isinstance(answer, dict) and isinstance(answer["answer"], dict)
                    event("answered")
    finally:
        sock.close()
        watchdog.broker.socket = original


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    frames=st.lists(st.one_of(_small, st.integers(5000, 9000).map(lambda n: "x" * n)).filter(_finite), max_size=6),
    junk=st.lists(st.binary(max_size=8), max_size=3),
    cuts=st.lists(st.integers(1, 6000), max_size=6),
)
def test_any_broker_frames_in_any_chunks_are_read_whole_or_skipped(frames, junk, cuts) -> None:
    """However the bytes are split into reads, the same frames come out; one over the reader's limit
    is skipped whole (None) and the frames after it are read as they were; bytes that are no JSON
    are None, never a guess; the reader never holds more than one frame's limit."""
    from ivralo_kernel.protocol import broker_frames

    limit = 4096
    pieces = [broker_frames.encode(frame) for frame in frames]
    pieces += [broker_frames.HEADER.pack(len(raw)) + raw for raw in junk]
    expected: list[object] = [frame if len(broker_frames.pack(frame)) <= limit else None for frame in frames]
    expected += [_json_or_none(raw) for raw in junk]
    data = b"".join(pieces)
    reader, found, at = broker_frames.FrameReader(limit), [], 0
    for size in [*cuts, len(data)]:
        found += reader.feed(data[at : at + size])
        at += size
        assert len(reader._buffer) <= limit + broker_frames.HEADER.size + max(cuts, default=0) + 6000
    assert found == expected


def _json_or_none(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def test_a_request_that_overtakes_its_executions_busy_waits_for_it(watchdog) -> None:
    """A request comes on the broker's socket, its execution's "busy" on IOPub: the two can arrive in
    either order. One that came first is held, then answered as from that execution once the busy
    is seen (not refused as from no running execution)."""
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket
    from ivralo_kernel.protocol import broker_frames

    assert watchdog.broker is not None
    original = watchdog.broker.socket
    sock = watchdog.broker.socket = BrokerSocket()
    kernel_end = sock._kernel
    assert kernel_end is not None
    kernel_end.settimeout(5)
    try:
        request = {"req_id": "early", "kind": "catalog", "payload": {}, "parent": "overtaken"}
        kernel_end.sendall(broker_frames.encode(request))
        watchdog._on_broker_socket()
        assert watchdog.broker.wakeup() is not None  # held: nothing answered yet
        status = {"header": {"msg_id": "s1", "msg_type": "status"}, "content": {"execution_state": "busy"}}
        watchdog._on_iopub({**status, "parent_header": {"msg_id": "overtaken", "msg_type": "execute_request"}})
        answers = broker_frames.FrameReader(broker_frames.MAX_ANSWER_BYTES)
        found: list[object] = []
        while not found:
            found = answers.feed(kernel_end.recv(1 << 16))
        assert found[0]["req_id"] == "early" and found[0]["answer"]["ok"] is True, found
        assert watchdog.broker.wakeup() is None
        idle = {**status, "content": {"execution_state": "idle"}}
        watchdog._on_iopub({**idle, "parent_header": {"msg_id": "overtaken", "msg_type": "execute_request"}})
    finally:
        sock.close()
        watchdog.broker.socket = original


def test_a_kernel_that_reads_no_answers_holds_no_thread_of_the_host() -> None:
    """The watchdog's thread answers some requests itself: a kernel that never reads its answers
    must not block it (nor a broker thread). Sends never wait; past MAX_QUEUED_BYTES unread, the
    kernel gets no more answers and sees its socket end."""
    import time

    from ivralo_kernel.host.watch.broker_socket import MAX_QUEUED_BYTES, BrokerSocket

    sock = BrokerSocket()
    kernel_end = sock._kernel
    assert kernel_end is not None
    try:
        big = {"req_id": "r", "answer": {"ok": True, "result": "x" * (1 << 20)}}
        started = time.monotonic()
        for _ in range((MAX_QUEUED_BYTES >> 20) + 16):  # more than the queue holds, none of it read
            sock.send(big)
        assert time.monotonic() - started < 30, "a send waited for the kernel"  # liveness only
        kernel_end.settimeout(30)
        total = 0
        while chunk := kernel_end.recv(1 << 20):  # what was written, then the end
            total += len(chunk)
        assert 0 < total <= MAX_QUEUED_BYTES + (4 << 20)
    finally:
        sock.close()


def test_a_kernel_that_writes_without_pause_lets_the_watchdog_go_each_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read takes a bounded amount (READS_PER_TURN chunks): a kernel writing requests as fast as
    they are read cannot keep the watchdog's thread (and its deadlines) in one read. (Small chunks
    here, so that the socket's own buffer holds many turns' worth.)"""
    from ivralo_kernel.host.watch import broker_socket
    from ivralo_kernel.protocol import broker_frames

    monkeypatch.setattr(broker_socket, "READ_CHUNK", 1024)
    monkeypatch.setattr(broker_socket, "READS_PER_TURN", 4)
    sock = broker_socket.BrokerSocket()
    kernel_end = sock._kernel
    assert kernel_end is not None
    try:
        frame = broker_frames.encode({"req_id": "r", "kind": "catalog", "payload": {}, "parent": None})
        kernel_end.sendall(frame * (64 * 1024 // len(frame)))  # 64 KiB: sixteen turns' worth
        first = sock.read()
        assert 0 < len(first) <= 4 * 1024 // len(frame) + 1, len(first)
        assert sock.read(), "the rest is read on the next turn"
    finally:
        sock.close()


def test_a_kernel_that_publishes_without_pause_lets_the_watchdog_go_each_turn() -> None:
    """The watchdog takes at most DRAIN_AT_ONCE messages of a socket a turn: a kernel publishing
    (signed status messages, say) as fast as they are read cannot keep it from its deadlines."""
    import zmq

    from ivralo_kernel.host.watch.kernel_channels import DRAIN_AT_ONCE, KernelChannels

    context = zmq.Context()
    kernel, ours = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    channels = KernelChannels({"key": "key", "signature_scheme": "hmac-sha256"})
    try:
        kernel.bind("inproc://flood")
        ours.connect("inproc://flood")
        for _ in range(DRAIN_AT_ONCE * 3):
            kernel.send_multipart([b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"])
        turns = 0
        while ours.poll(0):
            channels._drain(ours, lambda _msg: None)
            turns += 1
        assert turns == 3, turns
    finally:
        channels.close()
        kernel.close(linger=0)
        ours.close(linger=0)
        context.term()
