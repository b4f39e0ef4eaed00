"""``Session(gateway_url=...)`` against a real Jupyter Kernel Gateway on loopback (recipe:
../shared/notes/test-infrastructure.md §3a). The gateway starts the ``ivralo`` kernelspec, so the ivralo
provisioner runs in the gateway's process: it alone holds the credential and the grants.

Judged from outside: the loss message lists the variables, the endpoint got the key while the gateway's
kernel (its /proc environ, its namespace) never had it, the DataFrame comes back equal.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from servers import kernel_gateway
from test_broker import KEY, KEY_NAME, Endpoint, endpoint  # noqa: F401 - the loopback API endpoint fixture

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.sandbox.egress import untrusted_note
from ivralo_kernel.host.watch.processes import find_in_tree, host_pid

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def gateway_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway")


@pytest.fixture
def gateway(gateway_home: Path, endpoint: Endpoint) -> Iterator[tuple[str, int]]:  # noqa: F811
    """The gateway, with the API's operations and its key in its own environment and config only."""
    config_home = gateway_home / f"config-{uuid.uuid4().hex[:6]}"
    config_home.mkdir()
    spec = {
        "operations": {
            "test.search": {
                "url": f"http://127.0.0.1:{endpoint.port}/search",
                "credential": KEY_NAME,
                "auth": {"kind": "bearer"},
                "params": {"q": {"type": "string", "required": True}},
            }
        }
    }
    (config_home / "apis.json").write_text(json.dumps(spec), encoding="utf-8")
    workspace = gateway_home / "workspace"
    workspace.mkdir(exist_ok=True)
    # The gateway machine's own settings: its grants and its kernels' workspace.
    settings = {"IvraloProvisioner": {"grants": ["test"], "workspace": str(workspace)}}
    (config_home / "jupyter_ivralo_config.json").write_text(json.dumps(settings), encoding="utf-8")
    env = {**os.environ, "IVRALO_CONFIG_HOME": str(config_home), "JUPYTER_CONFIG_DIR": str(config_home), KEY_NAME: KEY}
    with kernel_gateway(gateway_home, TOKEN, env=env) as running:
        yield running


def kernel_pid(gateway: tuple[str, int], reported: int) -> int | None:
    """The gateway's kernel as this machine knows it: the pid it reports is the one in its sandbox."""
    return host_pid(gateway[1], reported) or (reported if psutil.pid_exists(reported) else None)


def url_of(gateway: tuple[str, int]) -> str:
    return f"{gateway[0]}/?token={TOKEN}"


async def test_run_deadline_kill_and_lost_variables(gateway: tuple[str, int], tmp_path: Path) -> None:
    config = WorkerConfig(deadline_ms=1500, interrupt_grace_ms=500)
    assert KEY_NAME not in os.environ  # the agent's machine has no credential
    async with Session(tmp_path, config=config, gateway_url=url_of(gateway)) as session:
        assert await session.run("x = 6 * 7\nprint(x)") == "42\n"
        assert session.pid is not None and kernel_pid(gateway, session.pid) is not None  # the gateway's child
        # An interrupt the cell swallows: the deadline interrupts, then restarts through the gateway.
        started = time.monotonic()
        lost = await session.run(
            "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        pass"
        )
        assert isinstance(lost, dict), lost
        assert "REPL worker terminated (timeout: execution exceeded deadline_ms=1500" in lost["error"]
        assert "ALL variables in this session were lost: x." in lost["error"]
        assert time.monotonic() - started < 10
        assert await session.run("print('x' in dir())") == "False\n"  # the same session goes on, fresh
        # An interrupt the cell honours ends it in time: the namespace stays.
        await session.run("y = 1")
        interrupted = await session.run("import time\ntime.sleep(30)")
        assert isinstance(interrupted, dict) and "interrupted" in interrupted["error"].lower(), interrupted
        assert await session.run("print(y)") == "1\n"


async def test_brokered_call_whose_key_never_reaches_the_gateways_kernel(
    gateway: tuple[str, int],
    endpoint: Endpoint,  # noqa: F811
    tmp_path: Path,
) -> None:
    async with Session(tmp_path, gateway_url=url_of(gateway)) as session:
        result = await session.run("r = ivralo.call('test.search', q='cats')\nprint(r.status, r.body['authorized'])")
        assert isinstance(result, str) and result.startswith("200 True\n"), result
        environ = await session.run("import os\nprint(sorted(k for k in os.environ if 'KEY' in k))")
        assert environ.startswith("[]\n"), environ
        assert session.pid is not None
        pid = kernel_pid(gateway, session.pid)
        assert pid is not None
        assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        names = await session.list_vars()
        assert "r" in names
        for name in names:  # the namespace holds no copy of it either
            assert KEY not in repr(await session.get_var(name, or_repr=True))
    assert "/search?q=cats" in endpoint.hits


async def test_dataframe_round_trip(gateway: tuple[str, int], tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"a": range(300_000), "b": [f"s{i}" for i in range(300_000)], "c": 0.5})
    async with Session(tmp_path, gateway_url=url_of(gateway)) as session:
        await session.inject_dataframe("df", frame)
        assert await session.run("print(df.shape, df['a'].sum())") == f"(300000, 3) {frame['a'].sum()}\n"
        await session.run("df2 = df.assign(d=df['a'] * 2)")
        back = await session.get_dataframe("df2")
        pd.testing.assert_frame_equal(back, frame.assign(d=frame["a"] * 2))
        assert (await session.snapshot())["df2"]["shape"] == [300_000, 4]


def test_jupyterlab_runs_a_cell_in_an_ivralo_kernel_on_the_gateway(gateway: tuple[str, int], tmp_path: Path) -> None:
    """JupyterLab with ``--GatewayClient.url``, in headless Chromium: the notebook's ivralo kernel is
    started by the gateway (a process of its tree), and the cell sees ``ivralo``. Chromium's first
    websocket fails (lab's gateway client answers no subprotocol) and lab leaves that attempt's socket
    to the gateway open: the reconnection, with the same session id, must take over the shell identity
    (tests/test_channel_relay.py)."""
    lab = pytest.importorskip("test_jupyterlab")
    if not os.path.exists(lab.CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    from servers import jupyter_server

    settings = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    nbdir = tmp_path / "notebooks"
    nbdir.mkdir()
    lab_args = (
        "--no-browser", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly", f"--GatewayClient.url={gateway[0]}",
        f"--GatewayClient.auth_token={TOKEN}",
    )  # fmt: skip
    with (
        jupyter_server("jupyterlab", nbdir, lab.TOKEN, *lab_args) as url,
        lab.playwright.sync_playwright() as p,
    ):
        home = tmp_path / "browser-home"
        home.mkdir()
        browser = p.chromium.launch(
            executable_path=lab.CHROMIUM, args=lab.CHROMIUM_ARGS, env={**os.environ, "HOME": str(home)}
        )
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
            lab.open_notebook(page, {"url": url, "nbdir": nbdir}, "gw.ipynb", "ivralo", "Python (ivralo)")
            lab.run_in_last_cell(page, "print('ivralo' in dir(), 6 * 7)")
            output = page.locator(".jp-Cell").first.locator(".jp-OutputArea-output")
            lab.playwright.expect(output).to_have_text("True 42", timeout=30_000)
            page.screenshot(path=str(tmp_path / "gateway-lab.png"))
            # The kernel lives on the gateway: in its list, and an ivralo supervisor in its process tree.
            request = urllib.request.Request(f"{gateway[0]}/api/kernels", headers={"Authorization": f"token {TOKEN}"})
            with urllib.request.urlopen(request, timeout=10) as response:
                kernels = json.loads(response.read())
            assert [k["name"] for k in kernels] == ["ivralo"]
            assert find_in_tree(gateway[1], "ivralo_kernel.supervisor") is not None
        finally:
            browser.close()


async def test_a_gateway_that_is_not_there_says_so_and_what_to_check() -> None:
    """A loopback port nothing listens on: the call's error names the gateway (never its token) and
    says what to check."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = closed.getsockname()[1]
        session = Session(gateway_url=f"http://127.0.0.1:{port}/?token=not-a-real-token-7f3a")
        try:
            result = await session.run("1 + 1")
        finally:
            await session.close()
    assert isinstance(result, dict) and result["status"] == "error", result
    assert f"the gateway http://127.0.0.1:{port} did not answer" in result["error"], result
    assert "jupyter-kernel-gateway runs there" in result["error"]
    assert "not-a-real-token" not in str(result)


@pytest.mark.parametrize("answer", ["yes", "no"])
async def test_the_agents_ask_answers_the_gateway_hosts_question(
    gateway: tuple[str, int], gateway_home: Path, tmp_path: Path, answer: str
) -> None:
    """Behind a gateway the host that asks is the gateway's provisioner, on its relay's stdin: the
    question reaches the agent's ``ask`` over the websocket, and its answer counts (judged by the
    loopback server's hits)."""
    from sandbox_cases import counting_http

    asked: list[tuple[str, tuple[str, ...]]] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append((question, choices))
        return answer

    with counting_http() as (port, hits):
        async with Session(tmp_path, ask=ask, gateway_url=url_of(gateway)) as session:
            code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/gw').status)"
            result = await session.run(code)
    # The gateway's kernels' folder is not trusted: the question says what offers "always".
    note = untrusted_note(os.path.realpath(gateway_home / "workspace"))
    question = f"Code in this cell wants to reach localhost, this machine, port {port}{note}"
    assert asked == [(question, ("yes", "no"))], result
    assert hits == (["/gw"] if answer == "yes" else []), result
