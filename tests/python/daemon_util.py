"""Start a real spgated on loopback with port 0 for the Python tests (it logs the ports it
bound), scrape its /metrics, and stop it."""
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "testing"))
import proc_util  # noqa: E402


@contextlib.contextmanager
def refused_address():
    """'127.0.0.1:PORT' where nothing listens for as long as the `with` lasts: the port is
    bound here and never listened on, so a connection is refused and no test beside this
    one can start a server there (a port only picked free could be taken meanwhile)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


def default_spgated():
    return os.environ.get("SPGATED", os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "build", "bin", "spgated"))


class Daemon:
    def __init__(self, spgated=None, extra_args=()):
        self.state_dir = tempfile.mkdtemp(prefix="spgate-pyd-")
        self.proc = subprocess.Popen(
            [spgated or default_spgated(), "--listen=127.0.0.1:0", "--admin_listen=127.0.0.1:0",
             "--metrics_listen=127.0.0.1:0", f"--state_dir={self.state_dir}", *extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"worker API on port (\d+), admin API on port (\d+), metrics on port (\d+)",
                          line)
            if m:
                self.port, self.admin_port, self.metrics_port = map(int, m.groups())
                self.address = f"127.0.0.1:{self.port}"
                # Keep draining its log so the daemon never blocks on a full pipe.
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()
                return
        self.proc.kill()
        self.proc.wait()
        raise RuntimeError("spgated did not report its ports")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as r:
            return r.read().decode()

    def decisions_total(self, job_id):
        """spgate_decisions_total{job_id} as {mode: {reason: count}}."""
        out = {}
        for line in self.metrics().splitlines():
            if not line.startswith("spgate_decisions_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            if labels.get("job_id") != job_id:
                continue
            n = int(float(line.rsplit(" ", 1)[1]))
            if n:
                out.setdefault(labels["mode"], {})[labels["reason"]] = n
        return out

    def signal(self, sig):
        self.proc.send_signal(sig)

    def freeze(self):
        proc_util.freeze(self.proc)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        proc_util.stop(self.proc)
        self.proc.stderr.close()
        shutil.rmtree(self.state_dir, ignore_errors=True)
