"""Helper for tests/test_network_dns.py; runs *inside* ``unshare --mount --net --propagation private``.

    python dns_stub_run.py <outer mnt ns> <outer net ns> <private etc folder> <workspace> <code file>

It refuses to touch anything unless its mount and network namespaces differ from the ones named
by the test (so a wrong invocation cannot bind-mount over the machine's /etc). Then, in the
private namespaces only:

1. brings loopback up (the new network namespace has nothing else);
2. bind-mounts a private ``/etc/resolv.conf`` (``nameserver 127.0.0.1``), a minimal ``/etc/hosts``
   (localhost only) and ``/etc/nsswitch.conf`` with ``hosts: files dns``;
3. serves DNS on 127.0.0.1:53/udp from a thread: every query is recorded (name, type); A for a
   known name is answered 127.0.0.1, other types of a known name get an empty NOERROR, unknown
   names NXDOMAIN;
4. runs the code file in a guarded kernel (``Session``, nobody to ask) in the workspace;
5. prints one line, ``RESULT_MARKER`` + JSON: the cell's result and every query the stub saw.

The assertions are the test's; this script only reports.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

RESULT_MARKER = "DNS-STUB-RESULT "
KNOWN = {"allowed.test": "127.0.0.1"}
TYPE_A, CLASS_IN = 1, 1
RCODE_NXDOMAIN = 3
RUN_TIMEOUT_S = 60.0


def parse_question(packet: bytes) -> tuple[str, int, int] | None:
    """(lower-cased name, qtype, end offset of the question), or None for what is not a query."""
    if len(packet) < 12:
        return None
    _, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or qdcount != 1:  # a response, or not exactly one question
        return None
    labels, pos = [], 12
    while True:
        if pos >= len(packet):
            return None
        length = packet[pos]
        pos += 1
        if length == 0:
            break
        if length & 0xC0 or pos + length > len(packet):  # no compression in a question we accept
            return None
        labels.append(packet[pos : pos + length].decode("ascii", "replace").lower())
        pos += length
    if pos + 4 > len(packet):
        return None
    qtype, _ = struct.unpack("!HH", packet[pos : pos + 4])
    return ".".join(labels), qtype, pos + 4


def answer(packet: bytes, name: str, qtype: int, end: int) -> bytes:
    query_id, flags = struct.unpack("!HH", packet[:4])
    address = KNOWN.get(name)
    rcode = 0 if address is not None else RCODE_NXDOMAIN
    records = b""
    if address is not None and qtype == TYPE_A:
        # Name as a pointer to the question (offset 12), A, IN, TTL 0, 4 bytes of address.
        records = struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 0, 4) + socket.inet_aton(address)
    # QR, the query's RD, RA; the question copied back as it came (glibc matches it).
    reply_flags = 0x8000 | (flags & 0x0100) | 0x0080 | rcode
    header = struct.pack("!HHHHHH", query_id, reply_flags, 1, 1 if records else 0, 0, 0)
    return header + packet[12:end] + records


class Stub:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 53))  # bound before any lookup can happen: no readiness race
        self.queries: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve, name="dns-stub", daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                packet, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            question = parse_question(packet)
            if question is None:
                continue
            with self.lock:
                self.queries.append(question[:2])
            self.sock.sendto(answer(packet, *question), peer)

    def seen(self) -> list[tuple[str, int]]:
        with self.lock:
            return list(self.queries)


def check_private_namespaces(outer_mnt: str, outer_net: str) -> None:
    mnt, net = os.readlink("/proc/self/ns/mnt"), os.readlink("/proc/self/ns/net")
    if mnt == outer_mnt or net == outer_net:
        raise SystemExit(f"refusing: not in private namespaces (mnt {mnt}, net {net}); run me under unshare")


def private_etc(folder: Path) -> None:
    """Loopback up; resolv.conf, hosts and nsswitch.conf replaced in this mount namespace only."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, timeout=10)
    nsswitch = Path("/etc/nsswitch.conf")
    lines = nsswitch.read_text().splitlines() if nsswitch.exists() else []
    lines = [line for line in lines if not line.lstrip().startswith("hosts:")] + ["hosts: files dns"]
    files = {
        "resolv.conf": "nameserver 127.0.0.1\noptions attempts:1 timeout:5\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "\n".join(lines) + "\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
        subprocess.run(["mount", "--bind", str(folder / name), f"/etc/{name}"], check=True, timeout=10)
        if Path(f"/etc/{name}").read_text() != text:
            raise SystemExit(f"/etc/{name} is not the private copy after the bind mount")


async def run_cell(workspace: Path, code: str) -> Any:
    from ivralo_kernel.host import Session, WorkerConfig

    # The guard as it is without the OS sandbox (inside it the kernel does no DNS at all), with
    # direct links to allowed hosts (landlock_network): by default the fallback refuses every direct
    # link, lookups included, with the reason, as the sandbox does.
    config = WorkerConfig(sandbox="off", landlock_network=True)
    async with Session(workspace=workspace, config=config) as session:
        return await asyncio.wait_for(session.run(code), RUN_TIMEOUT_S)


def main() -> None:
    outer_mnt, outer_net, etc_folder, workspace, code_file = sys.argv[1:6]
    check_private_namespaces(outer_mnt, outer_net)
    private_etc(Path(etc_folder))
    stub = Stub()  # its thread is a daemon: it ends with this process
    result = asyncio.run(run_cell(Path(workspace), Path(code_file).read_text()))
    report = {"result": result, "queries": stub.seen()}
    print(RESULT_MARKER + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
