"""Start an ivralo kernel for Jupyter Enterprise Gateway's remote process proxies.

Enterprise Gateway (EG) starts a remote kernel (a Kubernetes pod, or a process on another host)
through a launcher that speaks its handshake: choose the kernel's five ports, send the connection
info back to EG's response address encrypted with the public key EG passed in, then take signal
and shutdown requests on a "comm" port of its own. EG's own launcher (``launch_ipykernel.py``)
embeds ipykernel in its process. This one runs ivralo's supervisor instead, as a raw launch with
the connection file it wrote, so that everything a raw launch enforces holds here too: the OS
sandbox where one can be built, the guards, the deadline and the memory limit (from the
``IVRALO_*`` variables in the environment), and a process tree that ends with the supervisor.

The handshake follows EG 3.3's ``etc/kernel-launchers/python/scripts/launch_ipykernel.py``
(payload version 1: the connection info AES-encrypted, the AES key RSA-encrypted). It needs
``pycryptodomex``, as EG's launcher does; the kernel's interpreter does not.

Arguments are EG's (both spellings it passes): ``--kernel-id``, ``--response-address``,
``--public-key``, ``--port-range``; the rest of its launcher's arguments are accepted and unused.
``IVRALO_KERNEL_PYTHON`` names the interpreter that has ivralo (default: this one), and
``IVRALO_KERNEL_IP`` the address the kernel's ports listen on (default ``0.0.0.0``: in a pod, EG
reaches them over the pod network).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid

LAUNCHER_VERSION = 1  # the payload format EG 3.x decodes (its own launcher sends 1)
CHANNELS = ("shell", "iopub", "stdin", "hb", "control")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("kernel-id", "response-address", "public-key", "port-range"):
        dest = name.replace("-", "_")
        parser.add_argument(f"--{name}", f"--RemoteProcessProxy.{name}", dest=dest)
    # EG passes these to every Python launcher; a kernel here has no Spark context or cluster.
    for unused in ("spark-context-initialization-mode", "cluster-type", "kernel-class-name"):
        parser.add_argument(f"--{unused}", f"--RemoteProcessProxy.{unused}")
    args = parser.parse_args(argv)
    for required in ("kernel_id", "response_address", "public_key"):
        if not getattr(args, required):
            parser.error(f"--{required.replace('_', '-')} is required (Enterprise Gateway passes it)")
    return args


def port_range(text: str | None) -> tuple[int, int]:
    """EG's ``lower..upper`` (``0..0``: any free port)."""
    if not text:
        return 0, 0
    lower, _, upper = text.partition("..")
    low, high = int(lower), int(upper)
    if (low, high) != (0, 0) and not (1024 <= low < high):
        raise SystemExit(f"--port-range {text!r}: expected LOWER..UPPER with 1024 <= LOWER < UPPER, or 0..0")
    return low, high


def bound_socket(ip: str, low: int, high: int) -> socket.socket:
    """A TCP socket bound to a free port in the range (any port for ``0..0``)."""
    for _ in range(100):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((ip, random.randint(low, high) if high else 0))  # noqa: S311 (a port, not a secret)
            return sock
        except OSError:
            sock.close()
    raise SystemExit(f"no free port in {low}..{high} after 100 tries")


def write_connection_file(ip: str, low: int, high: int, kernel_id: str) -> tuple[str, dict[str, object]]:
    sockets = [bound_socket(ip, low, high) for _ in CHANNELS]
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:  # freed just before the supervisor binds them, as EG's launcher does
        sock.close()
    info: dict[str, object] = {f"{name}_port": port for name, port in zip(CHANNELS, ports, strict=True)}
    info |= {
        "ip": ip,
        "transport": "tcp",
        "key": str(uuid.uuid4()),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "",
    }
    fd, path = tempfile.mkstemp(suffix=".json", prefix=f"kernel-{kernel_id}_")
    with os.fdopen(fd, "w") as fp:
        json.dump(info, fp)
    return path, info


def encrypted(payload: bytes, public_key: str) -> bytes:
    from Cryptodome.Cipher import AES, PKCS1_v1_5
    from Cryptodome.PublicKey import RSA
    from Cryptodome.Random import get_random_bytes
    from Cryptodome.Util.Padding import pad

    aes_key = get_random_bytes(16)
    body = AES.new(aes_key, mode=AES.MODE_ECB).encrypt(pad(payload, 16))
    rsa = PKCS1_v1_5.new(RSA.importKey(base64.b64decode(public_key.encode())))
    message = {
        "version": LAUNCHER_VERSION,
        "key": base64.b64encode(rsa.encrypt(aes_key)).decode(),
        "conn_info": base64.b64encode(body).decode(),
    }
    return base64.b64encode(json.dumps(message).encode())


def send_connection_info(info: dict[str, object], args: argparse.Namespace, comm_port: int) -> None:
    host, _, port = str(args.response_address).rpartition(":")
    reply = {**info, "pid": os.getpid(), "pgid": os.getpgid(0), "comm_port": comm_port}
    reply["kernel_id"] = args.kernel_id
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(encrypted(json.dumps(reply).encode(), str(args.public_key)))


def serve_requests(comm: socket.socket, supervisor: subprocess.Popen[bytes]) -> None:
    """EG's requests, one JSON object per connection: ``{"signum": N}`` (0 is its liveness poll)
    goes to the supervisor, which passes SIGINT on to the kernel once; ``{"shutdown": 1}`` ends it."""
    while supervisor.poll() is None:
        try:
            conn, _ = comm.accept()
        except TimeoutError:
            continue
        with conn:
            data = b""
            while chunk := conn.recv(1024):
                data += chunk
        try:
            request = json.loads(data or b"{}")
        except ValueError:
            continue
        signum = int(request.get("signum", 0) or 0)
        if signum and supervisor.poll() is None:
            supervisor.send_signal(signum)
        if request.get("shutdown"):
            if supervisor.poll() is None:
                supervisor.terminate()
            return


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    low, high = port_range(args.port_range)
    ip = os.environ.get("IVRALO_KERNEL_IP", "0.0.0.0")  # noqa: S104 (in a pod, EG connects over the pod network)
    path, info = write_connection_file(ip, low, high, args.kernel_id)
    python = os.environ.get("IVRALO_KERNEL_PYTHON", sys.executable)
    # The same argv as the installed kernelspec's (kernelspec.kernel_argv): -P keeps the working
    # directory off sys.path, -B writes no bytecode.
    supervisor = subprocess.Popen([python, "-P", "-B", "-m", "ivralo_kernel.supervisor", "-f", path])
    # EG's shutdown ends the pod; a SIGTERM to this launcher ends the kernel with it.
    signal.signal(signal.SIGTERM, lambda *_: supervisor.terminate())
    comm = bound_socket(ip, low, high)
    comm.listen(1)
    comm.settimeout(1)
    send_connection_info(info, args, comm.getsockname()[1])
    threading.Thread(target=serve_requests, args=(comm, supervisor), daemon=True).start()
    code = supervisor.wait()
    os.unlink(path)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
