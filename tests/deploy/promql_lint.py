"""A small PromQL checker for spgate's dashboards and rules against docs/design.md §7.

It is not a PromQL parser (promtool checks syntax); it walks the token stream far enough
to find every series selector and label list, and proves that each one names a metric the
daemon exports (or a recording rule of ours), uses only that metric's labels, uses enum
label values that exist (reason="rs_wait", never "RS_WAIT"), takes rate() of counters
only, and never plots a raw counter. Those are the mistakes that produce an empty panel
in Grafana without any error.
"""
import re

import spgate_contract as contract

AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values", "group"}
FUNCTIONS = {"abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes",
             "clamp", "clamp_max", "clamp_min", "count_over_time", "day_of_month", "delta",
             "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
             "label_join", "label_replace", "last_over_time", "ln", "log2", "log10",
             "max_over_time", "min_over_time", "predict_linear", "quantile_over_time",
             "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt",
             "stddev_over_time", "sum_over_time", "time", "timestamp", "vector"}
COUNTER_FUNCS = {"rate", "irate", "increase", "resets"}
GAUGE_ONLY_FUNCS = {"delta", "deriv", "idelta", "predict_linear"}
KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "bool", "inf", "nan"}
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}

TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![a-zA-Z_]))
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<range>\[[^\]]*\])
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},@])
""", re.X)

KNOWN_LABELS = ("job_id", "group", "mode", "reason", "gate", "state", "result", "version",
                "instance", "job", "le", "namespace", "pod")


def Tokenize(expr):
    pos, out = 0, []
    while pos < len(expr):
        m = TOKEN_RE.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize at {expr[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def LevelLabels(record_name):
    """Labels a recording rule keeps, read from its `level:` prefix (job_id_mode → 2)."""
    level = record_name.split(":")[0]
    labels, rest = [], level
    while rest:
        for label in sorted(KNOWN_LABELS, key=len, reverse=True):
            if rest == label or rest.startswith(label + "_"):
                labels.append(label)
                rest = rest[len(label) + 1:]
                break
        else:
            raise ValueError(f"recording rule {record_name}: level {level!r} is not made of "
                             f"label names {KNOWN_LABELS}")
    return tuple(labels)


def Selectors(expr):
    """Yields dicts: name, matchers [(label, op, value)], func (enclosing function or '')."""
    tokens = Tokenize(expr)
    i, stack, result, label_lists = 0, [], [], []
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in LABEL_LIST_KEYWORDS and nxt == "(":
            j = i + 2
            names = []
            while tokens[j][1] != ")":
                if tokens[j][0] == "ident":
                    names.append(tokens[j][1])
                j += 1
            label_lists.append((text, names))
            i = j + 1
            continue
        if kind == "ident" and nxt == "(" and (text in FUNCTIONS or text in AGGREGATIONS):
            stack.append(text)
            i += 2
            continue
        if text == "(":
            stack.append("")
        elif text == ")":
            if stack:
                stack.pop()
        elif kind == "ident" and text.lower() not in KEYWORDS and text not in AGGREGATIONS:
            matchers = []
            j = i + 1
            if nxt == "{":
                j = i + 2
                while tokens[j][1] != "}":
                    if tokens[j][0] == "ident":
                        label, op, value = tokens[j][1], tokens[j + 1][1], tokens[j + 2][1]
                        matchers.append((label, op, value[1:-1]))
                        j += 3
                    else:
                        j += 1
                j += 1
            func = next((f for f in reversed(stack) if f), "")
            direct = stack[-1] if stack else ""
            result.append({"name": text, "matchers": matchers, "func": func,
                           "direct": direct})
            i = j
            continue
        i += 1
    return result, label_lists


def Lint(expr, recorded=()):
    """Returns a list of problems with `expr`; empty when it honours the contract.

    `recorded`: names of our recording rules that the expression may use.
    """
    problems = []
    index = contract.SeriesIndex()
    try:
        selectors, label_lists = Selectors(expr)
    except (ValueError, IndexError) as e:
        return [f"unparseable: {e}"]
    available = set(contract.TARGET_LABELS)
    if not selectors:
        problems.append("no series selector")
    for sel in selectors:
        name = sel["name"]
        family = None  # recording rules and `up`: values by label name alone
        if name in index:
            family, kind, labels = index[name]
            # Histogram _bucket/_sum/_count series are counters too.
            is_counter_series = kind in ("counter", "histogram")
            if sel["direct"] in COUNTER_FUNCS and not is_counter_series:
                problems.append(f"{sel['direct']}() of gauge {name}")
            if sel["direct"] in GAUGE_ONLY_FUNCS and is_counter_series:
                problems.append(f"{sel['direct']}() of counter {name}")
            if is_counter_series and sel["direct"] not in COUNTER_FUNCS and not (
                    sel["func"] == "absent"):
                problems.append(f"counter {name} used without rate()/increase()")
        elif name in recorded:
            labels = LevelLabels(name)
        elif name in contract.KUBE_STATE_METRICS:
            labels = contract.KUBE_STATE_METRICS[name]
        elif name == "up":
            labels = ()
        else:
            problems.append(f"unknown metric {name} (not in docs/design.md §7, not a recording rule)")
            continue
        allowed = set(labels) | set(contract.TARGET_LABELS)
        available |= allowed
        for label, op, value in sel["matchers"]:
            if label == "__name__":
                problems.append(f"{name}: __name__ matchers hide metric names from review")
                continue
            if label not in allowed:
                problems.append(f"{name} has no label {label!r} (has {sorted(labels)})")
                continue
            values = contract.LabelValues(family, label)
            if values is None:
                continue
            if op in ("=", "!="):
                if value not in values:
                    problems.append(f"{name}{{{label}{op}\"{value}\"}}: not one of {values}")
            elif re.fullmatch(r"[a-z_|]+", value):
                for alt in value.split("|"):
                    if alt not in values:
                        problems.append(f"{name}{{{label}=~\"{value}\"}}: {alt!r} not one of {values}")
    for keyword, names in label_lists:
        for label in names:
            if label not in available:
                problems.append(f"{keyword}({label}): no selected metric has that label")
    if "histogram_quantile" in expr:
        if not any("le" in names for kw, names in label_lists if kw == "by"):
            problems.append("histogram_quantile without `by (..., le)`")
    return problems
