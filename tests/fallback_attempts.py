"""A host, run by a test under the emulated container (``container.command("docker-default", ...)``),
where no sandbox can be built: it starts ivralo kernels with the ``ivralo`` kernelspec (``auto``, so
they run in the fallback) and makes the attempts, printing one JSON line the test judges together
with its loopback server's hits and the files on disk.

``python tests/fallback_attempts.py PATH PORT WORKSPACE_A WORKSPACE_B MARKER``: the provisioner's
path (KernelManager) or VS Code's (``--raw``: kernel.json's argv run by this script itself).

* ``layers``: each kernel's sandbox layer (the test checks it is the fallback);
* ``direct``: from A, a direct connect to PORT by ``sh -c curl``, a Python child and ctypes;
* ``asked``: from A, urllib through the proxy, the person at this client answering yes on stdin
  (provisioner path), with the prompts this client got;
* ``into_b``: from A's cell and from a Python child, every other kernel's connection file found (the
  Jupyter runtime folder, the fallback's run folders) is used to ask that kernel, by jupyter_client,
  to write MARKER; B would write it.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import answering, execute
from sandbox_cases import started_kernel

DIRECT = r"""
import ctypes, json, subprocess, sys
port = {port}
out = {{}}
out["sh"] = subprocess.run(["sh", "-c", f"curl -s --noproxy '*' -m 5 http://127.0.0.1:{{port}}/sh; echo rc=$?"],
                           capture_output=True, text=True).stdout
child = (f"import socket\ntry:\n socket.create_connection(('127.0.0.1', {{port}}), 5)"
         "\n print('connected')\nexcept OSError as e:\n print('refused', e.errno)")
out["child"] = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True).stdout
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
addr = (ctypes.c_ubyte * 16)(2, 0, port >> 8, port & 255, 127, 0, 0, 1)
rc = libc.connect(fd, addr, 16)
out["ctypes"] = [rc, ctypes.get_errno()]
if rc == 0:
    libc.send(fd, b"GET /ctypes HTTP/1.0\r\n\r\n", 24, 0)
print("RESULT", json.dumps(out))
"""

# The connection files an attacker in A finds: the Jupyter runtime folder's, and B's own (in its run
# folder, named here: a glob of /tmp would reach other kernels of this machine than the test's).
# Each one's kernel is asked to write the marker, from the cell and a child.
INTO_OTHERS = r"""
import glob, json, os, subprocess, sys
marker = {marker!r}
own = os.path.realpath(sys.argv[sys.argv.index("-f") + 1])
files = [f for f in glob.glob(os.path.join({runtime!r}, "kernel-*.json")) + {b_files!r} if os.path.realpath(f) != own]
attempt = '''
import json, sys
from jupyter_client.blocking.client import BlockingKernelClient
info = json.load(open(sys.argv[1]))
kc = BlockingKernelClient()
kc.load_connection_info(info)
kc.start_channels()
try:
    kc.execute_interactive("open(%r, 'w').write('B ran this')" % sys.argv[2], timeout=3)
    print("sent")
except Exception as e:
    print(type(e).__name__)
finally:
    kc.stop_channels()
'''
out = {{}}
for f in files:
    try:
        readable = bool(open(f).read())
    except OSError as e:
        out[f] = "unreadable " + type(e).__name__
        continue
    done = subprocess.run([sys.executable, "-c", attempt, f, marker], capture_output=True, text=True, timeout=60)
    in_cell = {{}}
    exec(attempt.replace("sys.argv[1]", repr(f)).replace("sys.argv[2]", repr(marker)), in_cell)
    out[f] = "read; child: " + (done.stdout.strip() or done.stderr.strip()[-200:])
print("RESULT", json.dumps(out))
"""


def result(stdout: str) -> Any:
    line = next((line for line in stdout.splitlines() if line.startswith("RESULT ")), None)
    return json.loads(line.removeprefix("RESULT ")) if line else {"no result": stdout[-2000:]}


def layer(kc: BlockingKernelClient) -> str:
    return str(kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["layers"]["sandbox"])


@contextlib.contextmanager
def raw_kernel(workspace: Path, scratch: Path) -> Iterator[BlockingKernelClient]:
    from test_vscode_launch import raw_launch

    scratch.mkdir(exist_ok=True)
    with raw_launch(workspace, scratch) as raw:
        yield raw.client


def kernel_files(kc: BlockingKernelClient) -> list[str]:
    """B's own connection file (its kernel's ``-f``), from the process table."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "-f" in cmd and "ivralo_kernel.kernel" in " ".join(cmd):
            path = cmd[cmd.index("-f") + 1]
            with contextlib.suppress(OSError, ValueError):
                if json.loads(Path(path).read_text()).get("key") == kc.session.key.decode():
                    found.append(path)
    return found


def main() -> None:
    raw = "--raw" in sys.argv
    path, port, a, b, marker = [arg for arg in sys.argv[1:] if arg != "--raw"]
    del path
    report: dict[str, Any] = {}
    from jupyter_core.paths import jupyter_runtime_dir

    with contextlib.ExitStack() as stack:
        if raw:
            kc_a = stack.enter_context(raw_kernel(Path(a), Path(a).parent / "raw-a"))
            kc_b = stack.enter_context(raw_kernel(Path(b), Path(b).parent / "raw-b"))
            runtime = str(Path(a).parent / "raw-b")
        else:
            kc_a = stack.enter_context(started_kernel("ivralo", Path(a)))[1]
            kc_b = stack.enter_context(started_kernel("ivralo", Path(b)))[1]
            runtime = jupyter_runtime_dir()
        report["layers"] = [layer(kc_a), layer(kc_b)]
        report["direct"] = result(execute(kc_a, DIRECT.format(port=port), timeout=90).stdout)
        if not raw:
            code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/yes').status)"
            ran, prompts = answering(kc_a, code, ["yes"], timeout=90)
            report["asked"] = {"prompts": prompts, "stdout": ran.stdout}
        code = INTO_OTHERS.format(marker=marker, runtime=runtime, b_files=kernel_files(kc_b))
        ran = execute(kc_a, code, timeout=180)
        errors = [str(o["content"].get("evalue")) for o in ran.outputs if o["header"]["msg_type"] == "error"]
        report["into_b"] = result(ran.stdout + ran.stderr + "\n".join(errors))
        report["b_alive"] = execute(kc_b, "print(6 * 7)").stdout
    print("REPORT", json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
