"""spgate.progress: the line's format (the same as common/progress.h's, see
tests/common/progress_test.cc) and one line per interval with an injected clock."""

import io
import unittest

import spgate.progress as progress


class Clock:
    def __init__(self):
        self.now = 100.0
        self.reads = 0

    def __call__(self):
        self.reads += 1
        return self.now


class TtyBuffer(io.StringIO):
    def isatty(self):
        return True


class FormatTest(unittest.TestCase):
    def test_table(self):
        cases = [
            (dict(label="spgate-sim replay", steps=120, total_steps=1000, tokens_per_s=3100,
                  sp=80, tp=20, eta_s=41),
             "spgate-sim replay: step 120/1000 (12%)  3.1k tok/s  SP 80% TP-only 20%  ETA 0:41"),
            (dict(label="x", steps=6.5, total_steps=10, tokens_per_s=12.4e6, simulated=True,
                  sp=1, tp=2, eta_s=3723, rate_unit="tok/s/job"),
             "x: step 6/10 (65%)  12.4M sim tok/s/job  SP 33% TP-only 67%  ETA 1:02:03"),
            (dict(label="", steps=3), "step 3"),
            (dict(label="w", steps=5, tokens_per_s=950, tp=5),
             "w: step 5  950 tok/s  SP 0% TP-only 100%"),
        ]
        for kw, want in cases:
            self.assertEqual(progress.format_line(**kw), want)
        self.assertEqual(progress.format_eta(599.6), "10:00")
        self.assertEqual(progress.format_rate(999.6), "1.0k")


class ProgressTest(unittest.TestCase):
    def test_one_line_per_interval(self):
        clock, out = Clock(), io.StringIO()
        p = progress.Progress(total_steps=100, label="t", interval_s=2.0, enabled=True,
                              stream=out, clock=clock, rate_unit="tok/s/group")
        for i in range(16):  # 16 steps of 0.125 s: a line at 2 s, none before
            clock.now += 0.125
            p.add(tokens=1000, mode="sp" if i < 8 else "tp_only")
            if i < 15:
                self.assertEqual(out.getvalue(), "")
        self.assertEqual(out.getvalue(),
                         "t: step 16/100 (16%)  8.0k tok/s/group  SP 50% TP-only 50%  ETA 0:11\n")
        clock.now += 0.5
        p.add(tokens=500, mode="tp_only")
        self.assertEqual(p.lines, 1)
        p.finish()
        p.finish()
        self.assertEqual(p.lines, 2)
        self.assertTrue(out.getvalue().splitlines()[1].startswith("t: step 17/100 (17%)  1.0k tok/s/group"))

    def test_finish_says_nothing_the_last_line_said(self):
        clock, out = Clock(), io.StringIO()
        p = progress.Progress(label="t", interval_s=1.0, enabled=True, stream=out, clock=clock)
        clock.now += 1
        p.add(mode="sp")
        clock.now += 1
        p.finish()
        self.assertEqual(p.lines, 1)

    def test_check_every(self):
        clock, out = Clock(), io.StringIO()
        p = progress.Progress(label="t", interval_s=0.0, enabled=True, stream=out, clock=clock,
                              check_every=16)
        reads = clock.reads
        for _ in range(64):
            clock.now += 1
            p.add()
        self.assertEqual(clock.reads - reads, 4)
        self.assertEqual(p.lines, 4)
        self.assertEqual(out.getvalue().splitlines()[0], "t: step 16")  # no tokens: no tok/s

    def test_enabled_only_on_a_terminal_or_when_asked(self):
        for stream, flag, want in [(io.StringIO(), None, False), (TtyBuffer(), None, True),
                                   (TtyBuffer(), False, False), (io.StringIO(), True, True)]:
            p = progress.Progress(total_steps=1, label="t", interval_s=0.0, enabled=flag,
                                  stream=stream)
            p.add(tokens=1, mode="sp")
            p.finish()
            self.assertEqual(bool(stream.getvalue()), want, (flag, type(stream)))


if __name__ == "__main__":
    unittest.main()
