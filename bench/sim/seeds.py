"""Seeds for the simulator's benchmark drivers (docs/benchmarks.md): the SEEDS list every
seeded driver takes, and each reported figure's median and range (min-max) over the seeds.

A driver runs every cell once per seed, computes the cell's figures per seed, and reports
the median with its range; targets are checked on the medians.
"""
import collections
import re
import statistics


def parse(text, what="--seeds"):
    """'11 12 13' or '11,12,13' -> [11, 12, 13]; exits naming the bad entry otherwise."""
    seeds = []
    for tok in re.split(r"[\s,]+", str(text).strip()):
        if not tok:
            continue
        if not re.fullmatch(r"[0-9]+", tok):
            raise SystemExit(f"{what}: {tok!r} is not a seed (a non-negative integer; "
                             "a list such as '11 12 13 14 15')")
        seeds.append(int(tok))
    if not seeds:
        raise SystemExit(f"{what}: no seed given (a list such as '11 12 13 14 15')")
    dup = [s for s, n in collections.Counter(seeds).items() if n > 1]
    if dup:
        raise SystemExit(f"{what}: seed {dup[0]} is listed twice")
    return seeds


def _numeric(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Spread:
    """The median and range over seeds of each figure in per-seed dicts. A figure is a
    number, a list of numbers (taken element-wise, e.g. one per pipeline stage), None
    (undefined on that seed: left out; None where no seed has it) or a string (the most
    common value: which policy is the best fixed choice)."""

    def __init__(self, per_seed):
        if not per_seed:
            raise ValueError("Spread: no seeds")
        self.n = len(per_seed)
        self.median, self.min, self.max = {}, {}, {}
        for key in per_seed[0]:
            vals = [f[key] for f in per_seed if f[key] is not None]
            if not vals:
                self.median[key] = self.min[key] = self.max[key] = None
            elif all(_numeric(v) for v in vals):
                self.median[key] = statistics.median(vals)
                self.min[key], self.max[key] = min(vals), max(vals)
            elif all(isinstance(v, list) for v in vals):
                cols = list(zip(*vals))
                self.median[key] = [statistics.median(c) for c in cols]
                self.min[key] = [min(c) for c in cols]
                self.max[key] = [max(c) for c in cols]
            else:
                self.median[key] = collections.Counter(vals).most_common(1)[0][0]
                self.min[key] = self.max[key] = None

    def fmt(self, key, spec="%.4f", scale=1.0):
        """'median' for one seed, 'median (min–max)' for more."""
        med = spec % (scale * self.median[key])
        if self.n == 1:
            return med
        return "%s (%s–%s)" % (med, spec % (scale * self.min[key]), spec % (scale * self.max[key]))

    def to_json(self, ndigits=6):
        r = lambda v: ([round(x, ndigits) for x in v] if isinstance(v, list) else
                       round(v, ndigits) if _numeric(v) else v)
        return {"median": {k: r(v) for k, v in self.median.items()},
                "min": {k: r(v) for k, v in self.min.items()},
                "max": {k: r(v) for k, v in self.max.items()}}
