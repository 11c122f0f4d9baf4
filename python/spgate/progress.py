"""A progress line for long training loops, the same line spgate-worker and spgate-sim print
(common/progress.h; docs/worker.md, "Progress lines"):

    train.py, TP group 0: step 120/1000 (12%)  3.1k tok/s/group  SP 80% TP-only 20%  ETA 0:41

printed to stderr at a steady interval, only when stderr is a terminal or the caller asks
(``enabled=True``, e.g. from ``--progress``), so logs and JSON outputs never change. The rate
is wall-clock over the last interval, in ``rate_unit`` (``tok/s/group`` when the caller counts
one TP group's tokens, ``tok/s/job`` when every group's); the modes are shares of the
decisions so far; the ETA is from the mean step rate. The clock is read at most once per ``check_every`` calls.

Usage::

    progress = spgate.progress.Progress(total_steps=args.steps, label="train.py",
                                        enabled=args.progress)
    for step in range(args.steps):
        ...
        progress.add(tokens=batch.tokens, mode=d.mode)
    progress.finish()
"""

import math
import sys
import time

__all__ = ["Progress", "format_line", "format_eta", "format_rate", "wanted"]


def format_eta(seconds):
    """0:41, 12:03, 1:02:03."""
    s = int(math.floor(max(0.0, seconds) + 0.5))
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def format_rate(v):
    """950, 3.1k, 12.4M."""
    if v >= 999.5e6:
        return f"{v / 1e9:.1f}G"
    if v >= 999.5e3:
        return f"{v / 1e6:.1f}M"
    if v >= 999.5:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


def format_line(label, steps, total_steps=0, tokens_per_s=None, sp=0, tp=0, eta_s=None,
                simulated=False, rate_unit="tok/s"):
    """The line from its totals; a None or unknown field is left out."""
    out = f"{label}: " if label else ""
    done = int(math.floor(steps + 1e-9))
    if total_steps > 0:
        out += f"step {done}/{total_steps} ({int(100.0 * steps / total_steps)}%)"
    else:
        out += f"step {done}"
    if tokens_per_s is not None:
        out += f"  {format_rate(tokens_per_s)} {'sim ' if simulated else ''}{rate_unit}"
    if sp + tp > 0:
        # C's lround: halves away from zero (Python's round() would go to even).
        sp_pct = int(math.floor(100.0 * sp / (sp + tp) + 0.5))
        out += f"  SP {sp_pct}% TP-only {100 - sp_pct}%"
    if eta_s is not None:
        out += f"  ETA {format_eta(eta_s)}"
    return out


def wanted(flag, stream=None):
    """``flag`` when given (True/False), else whether ``stream`` (stderr) is a terminal."""
    if flag is not None:
        return bool(flag)
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """Counts steps, tokens and decisions; prints a line when ``interval_s`` has passed.

    ``enabled``: True, False, or None (whether the stream is a terminal). ``clock`` and
    ``stream`` are for tests. Disabled, every call returns at once.
    """

    def __init__(self, total_steps=0, label="", interval_s=2.0, enabled=None, stream=None,
                 clock=time.monotonic, check_every=1, rate_unit="tok/s"):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = wanted(enabled, self.stream)
        self.total_steps = total_steps
        self.label = label
        self.rate_unit = rate_unit  # whose tokens: "tok/s/group" or "tok/s/job"
        self.interval_s = interval_s
        self.clock = clock
        self.check_every = max(1, int(check_every))
        self.lines = 0
        self._steps = 0
        self._tokens = 0.0
        self._sp = self._tp = 0
        self._calls = 0
        self._finished = False
        self._start = self._last = clock() if self.enabled else 0.0
        self._tokens_at_last = 0.0
        self._steps_at_last = 0

    def add(self, steps=1, tokens=0, mode=None, sp=0, tp=0):
        """One step done (or ``steps``): its tokens and its decision's ``mode`` (a
        spgate.Mode, or counts ``sp``/``tp`` for a step of several decisions)."""
        if not self.enabled or self._finished:
            return
        self._steps += steps
        self._tokens += tokens
        if mode is not None:
            if _is_sp(mode):
                sp += 1
            else:
                tp += 1
        self._sp += sp
        self._tp += tp
        self._calls += 1
        if self._calls % self.check_every:
            return
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._print(now)

    def finish(self):
        """The last line, once (none if nothing was added, or no step ended since the
        last line)."""
        if not self.enabled or self._finished:
            return
        self._finished = True
        if self._calls and (self.lines == 0 or self._steps != self._steps_at_last):
            self._print(self.clock())

    def _print(self, now):
        rate = None
        if self._tokens > 0 and now > self._last:  # a loop that counts no tokens shows none
            rate = (self._tokens - self._tokens_at_last) / (now - self._last)
        eta = None
        if self.total_steps > 0 and self._steps > 0:
            eta = (now - self._start) * (self.total_steps - self._steps) / self._steps
        self.stream.write(format_line(self.label, self._steps, self.total_steps, rate,
                                      self._sp, self._tp, eta, rate_unit=self.rate_unit) + "\n")
        self.stream.flush()
        self._last = now
        self._tokens_at_last = self._tokens
        self._steps_at_last = self._steps
        self.lines += 1


def _is_sp(mode):
    """spgate.Mode.SEQUENCE_PARALLEL (its label "sp"), or the label itself."""
    return getattr(mode, "label", mode) == "sp"
