"""50 fresh Sessions, each asking once about an unknown loopback host; counts hangs (no answer in 30 s)."""
import asyncio, http.server, os, sys, tempfile, threading, time
from pathlib import Path
base = Path(tempfile.mkdtemp(prefix="ivr-sess-"))
for var, sub in (("JUPYTER_CONFIG_DIR","config"),("JUPYTER_DATA_DIR","data"),("JUPYTER_RUNTIME_DIR","runtime"),("IPYTHONDIR","ipython"),("IVRALO_CONFIG_HOME","ivralo-config"),("MPLCONFIGDIR","mpl")):
    (base/sub).mkdir(); os.environ[var]=str(base/sub)
os.environ["JUPYTER_PLATFORM_DIRS"]="1"
from ivralo_kernel.host import Session
hits = []
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        hits.append(1); self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H); threading.Thread(target=httpd.serve_forever, daemon=True).start()
port = httpd.server_address[1]
async def yes(q, choices): return "yes"
async def main(n):
    hangs = 0
    for i in range(n):
        ws = base / f"ws{i}"; ws.mkdir()
        t = time.monotonic()
        async with Session(workspace=ws, ask=yes) as s:
            try:
                out = await asyncio.wait_for(s.run(f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/').status)"), 30)
            except asyncio.TimeoutError:
                out = "HANG"; hangs += 1
        print(i, repr(out)[:80], f"{time.monotonic()-t:.2f}s", flush=True)
    print("hangs", hangs, "of", n, "server hits", len(hits))
asyncio.run(main(int(sys.argv[1])))
