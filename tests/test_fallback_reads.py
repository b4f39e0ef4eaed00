"""The fallback's reads and sockets, under the emulated container (tests/container.py's
``docker-default``: bwrap cannot build a sandbox, so the kernel runs in the fallback). Judged from
outside: a loopback UDP listener's and a TCP server's counts, the files the cells' shells wrote, and
that no secret appears in anything the kernel sent."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from container import run
from sandbox_cases import tcp_and_udp

from ivralo_kernel.guards.landlock import abi

HERE = Path(__file__).resolve().parent
FAKE_KEY = "-----BEGIN OPENSSH PRIVATE KEY----- fake-4c1e9a77d2 -----END OPENSSH PRIVATE KEY-----"

ATTEMPTS = r"""
import ctypes, json, os, socket, subprocess
other = OTHER_CONNECTION_FILE
runtime = os.path.dirname(other)
got = {}
def attempt(name, fn):
    try:
        got[name] = repr(fn())[:300]
    except BaseException as e:
        got[name] = type(e).__name__
def sh(script):
    return subprocess.run(['sh', '-c', script], capture_output=True, text=True, timeout=60).stdout
attempt('read key', lambda: open(os.path.expanduser('~/.ssh/id_rsa')).read())
attempt('read other', lambda: open(other).read())
attempt('list runtime', lambda: os.listdir(runtime))
libc = ctypes.CDLL(None, use_errno=True)
def c_read(path):
    fd = libc.open(path.encode(), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'open')
    buf = ctypes.create_string_buffer(4096)
    return buf.raw[: libc.read(fd, buf, 4096)]
attempt('ctypes key', lambda: c_read(os.path.expanduser('~/.ssh/id_rsa')))
attempt('ctypes other', lambda: c_read(other))
sh(f'cat ~/.ssh/id_rsa > leak-key.txt; cat {other} > leak-other.txt; ls -a {runtime} > leak-runtime.txt')
child = (
    "import socket\n"
    "for name, make in [('udp', lambda: socket.socket(2, 2)), ('udp6', lambda: socket.socket(10, 2)),"
    " ('raw', lambda: socket.socket(2, 3, 17)), ('packet', lambda: socket.socket(17, 3, 0)),"
    " ('mptcp', lambda: socket.socket(2, 1, 262))]:\n"
    "    try:\n"
    "        s = make()\n"
    "        s.sendto(b'x', ('127.0.0.1', UDP)) if name != 'mptcp' else s.connect(('127.0.0.1', TCP))\n"
    "        print(name, 'done')\n"
    "    except OSError as e:\n"
    "        print(name, type(e).__name__)\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.sendto(b'GET / HTTP/1.0\\r\\n\\r\\n', 0x20000000, ('127.0.0.1', TCP)); print('tfo done')\n"
    "except OSError as e:\n"
    "    print('tfo', type(e).__name__)\n"
    "try:\n"
    "    s = socket.socket(); s.setsockopt(6, 30, 1); s.connect(('127.0.0.1', TCP)); print('tfo-connect done')\n"
    "except OSError as e:\n"
    "    print('tfo-connect', type(e).__name__)\n"
)
got['sh python'] = sh("python3 -I -c " + __import__('shlex').quote(child))
def c_udp():
    fd = libc.socket(2, 2, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), 'socket')
    addr = (ctypes.c_ubyte * 16)(2, 0, UDP >> 8, UDP & 255, 127, 0, 0, 1)
    return libc.sendto(fd, b'x', 1, 0, addr, 16)
attempt('ctypes udp', c_udp)
def c_mptcp():
    if libc.socket(2, 1, 262) < 0:
        raise OSError(ctypes.get_errno(), 'socket')
attempt('ctypes mptcp', c_mptcp)
import numpy, pandas, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
plt.plot([1, 2, 3]); plt.savefig('plot.png')
got['pip'] = sh('python3 -m pip --version')[:4]
got['hosts'] = 'localhost' in open('/etc/hosts').read()
hm = get_ipython().history_manager
got['history'] = [str(hm.hist_file), hm.db.execute('select count(*) from sessions').fetchone()[0]]
got['ipython folder'] = 'startup' in os.listdir(os.path.expanduser('~/.ipython/profile_default'))
attempt('config home', lambda: open(os.path.expanduser('~/.config/ivralo/marker.json')).read())
got['pandas'] = int(pandas.DataFrame({'a': numpy.arange(3)}).a.sum())
print(json.dumps(got))
"""


@pytest.mark.timeout(600)
@pytest.mark.skipif(abi() < 1, reason="Landlock is not available on this kernel: the read floor cannot exist")
def test_the_fallback_reads_and_sockets_are_closed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(FAKE_KEY)
    (home / ".config" / "ivralo").mkdir(parents=True)
    (home / ".config" / "ivralo" / "marker.json").write_text('{"marker": "cfg-77a1e0"}')
    workspace = tmp_path / "work"
    workspace.mkdir()
    # The newcomer's folders: Jupyter's runtime folder, the config home and IPython's folder are
    # where they are by default, in the (fake) home folder; only the kernelspec is found elsewhere.
    moved = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR")
    env = {k: v for k, v in os.environ.items() if k not in (*moved, "IVRALO_CONFIG_HOME", "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    with tcp_and_udp() as (tcp_port, udp_port, tcp_hits, udp_hits):
        code = tmp_path / "attempts.py"
        code.write_text(ATTEMPTS.replace("UDP", str(udp_port)).replace("TCP", str(tcp_port)))
        argv = [sys.executable, str(HERE / "fallback_read_attempts.py"), "ivralo", str(workspace), str(code)]
        done = run("docker-default", argv, env=env, cwd=workspace, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    layers, iopub, other = report["layers"], report["iopub"], report["other"]
    assert layers["sandbox"].startswith("none"), layers["sandbox"]
    assert "fs-read" in layers["landlock"], layers["landlock"]
    assert "TCP only" in layers["seccomp"], layers["seccomp"]
    everything = json.dumps(iopub)
    other_key = json.loads(Path(other).read_text())["key"] if Path(other).exists() else None
    # Never the kernel's word alone: no secret in anything it sent, nor in the files its shell wrote.
    assert "fake-4c1e9a77d2" not in everything, "the fake key was sent"
    assert "cfg-77a1e0" not in everything, "the config home's file was sent"
    assert other.startswith(str(home / ".local" / "share" / "jupyter" / "runtime")), other
    assert other_key is None or other_key not in everything
    for leak in ("leak-key.txt", "leak-other.txt", "leak-runtime.txt"):
        text = (workspace / leak).read_text()
        assert "fake-4c1e9a77d2" not in text and (other_key is None or other_key not in text), leak
        assert os.path.basename(other) not in text, leak
    assert udp_hits.hits == 0 and tcp_hits.hits == 0, everything
    streams = [m["content"]["text"] for m in iopub if m["type"] == "stream" and m["content"]["name"] == "stdout"]
    got = json.loads("".join(streams).strip().splitlines()[-1])
    for name in ("read key", "read other", "list runtime", "ctypes key", "ctypes other", "config home"):
        assert got[name] in ("PermissionError", "GuardRefusal", "OSError"), (name, got[name])
    for line in ("udp", "udp6", "raw", "packet", "mptcp", "tfo", "tfo-connect"):
        assert f"{line} PermissionError" in got["sh python"].splitlines(), got["sh python"]
    assert got["ctypes udp"] == "PermissionError" and got["ctypes mptcp"] == "PermissionError", got
    # Everyday work still works.
    assert (workspace / "plot.png").read_bytes().startswith(b"\x89PNG")
    assert got["pip"] == "pip ", got
    assert got["hosts"] is True and got["pandas"] == 3, got
    # IPython's history answers (in memory: the write floor keeps IPython's folder unwritable, as on
    # main, since a startup file there would run in the next kernel), and its folder can be read.
    assert got["history"][1] >= 1 and got["ipython folder"] is True, got


# In docker-stacks' work/ folder: the home folder's top level takes no new entry (its dot-entries
# stay closed, existing or not: tests/test_closed_links_and_home.py), so work goes on in a subfolder.
EVERYDAY_IN_HOME = r"""
import json, os
with open("work/made-after-start.csv", "w") as f:
    f.write("a,b\n1,2\n")
listed = "work" in os.listdir(".") and "made-after-start.csv" in os.listdir("work")
print(json.dumps({"read back": open("work/made-after-start.csv").read(), "listed": listed}))
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(abi() < 1, reason="Landlock is not available on this kernel: the read floor cannot exist")
def test_with_the_workspace_the_home_folder_a_cell_reads_back_what_it_wrote(tmp_path: Path) -> None:
    """docker-stacks' JupyterLab runs in /home/jovyan: the workspace is the home folder, which holds the
    runtime folder. The read floor grants the workspace whole, so the newcomer's first cells work."""
    home = tmp_path / "home"
    (home / "work").mkdir(parents=True)  # as docker-stacks' image has it
    moved = ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR")
    env = {k: v for k, v in os.environ.items() if k not in (*moved, "IVRALO_CONFIG_HOME", "XDG_CONFIG_HOME")}
    env["HOME"] = str(home)
    code = tmp_path / "everyday.py"
    code.write_text(EVERYDAY_IN_HOME)
    argv = [sys.executable, str(HERE / "fallback_read_attempts.py"), "ivralo", str(home), str(code)]
    done = run("docker-default", argv, env=env, cwd=home, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "fs-read" in report["layers"]["landlock"], report["layers"]["landlock"]
    streams = [
        m["content"]["text"] for m in report["iopub"] if m["type"] == "stream" and m["content"]["name"] == "stdout"
    ]
    got = json.loads("".join(streams).strip().splitlines()[-1])
    assert got == {"read back": "a,b\n1,2\n", "listed": True}, got
    assert (home / "work" / "made-after-start.csv").read_text() == "a,b\n1,2\n"
