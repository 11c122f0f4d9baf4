"""Helpers the Python tests share for the processes they drive (spgated, spgate-worker).

Import with the folder on sys.path:
    sys.path.insert(0, os.path.join(REPO, "tests", "testing"))
    import proc_util
"""
import signal
import subprocess
import time


def freeze(proc, what="spgated"):
    """SIGSTOP `proc` (a subprocess.Popen), and wait (bounded) until the kernel reports it
    stopped: the signal is asynchronous, and a process still running can answer in
    microseconds. RuntimeError if it is not stopped within 5 s."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.001)
    raise RuntimeError(f"{what} did not stop on SIGSTOP")


def data_lines(path):
    """The lines of a CSV file after its header (a worker's --decision_log); none while
    the file does not exist yet."""
    try:
        with open(path) as f:
            return f.read().splitlines()[1:]
    except FileNotFoundError:
        return []


def stop(proc, timeout=20):
    """Ends `proc` if it still runs: SIGCONT (it may be frozen), SIGTERM, and SIGKILL if it
    has not exited within `timeout` s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
