"""Reading PromQL far enough to check it against a scrape: which metrics an expression
selects, with which label matchers, and which labels it groups and matches on.

Not a PromQL parser: a tokenizer and a walk over the tokens, enough for the expressions of
deploy/crihook-alerts.yaml and deploy/crihook-dashboard.json (selectors, range vectors,
functions, aggregations with `by`/`without`, `on`/`ignoring`/`group_left`/`group_right`,
binary operators, `bool`, `offset`). Grafana's variables are substituted first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = [
    "AGGREGATIONS",
    "FUNCTIONS",
    "Expression",
    "Matcher",
    "PromQLError",
    "Selector",
    "read",
    "template_labels",
]

AGGREGATIONS = frozenset(
    [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ]
)
FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "delta",
        "deriv",
        "exp",
        "floor",
        "histogram_quantile",
        "histogram_avg",
        "histogram_count",
        "histogram_sum",
        "histogram_fraction",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "irate",
        "label_join",
        "label_replace",
        "ln",
        "log2",
        "log10",
        "minute",
        "month",
        "predict_linear",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sort",
        "sort_desc",
        "sqrt",
        "time",
        "timestamp",
        "vector",
        "year",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "quantile_over_time",
        "stddev_over_time",
        "stdvar_over_time",
        "last_over_time",
        "present_over_time",
    ]
)
_GROUPING = frozenset(["by", "without", "on", "ignoring", "group_left", "group_right"])
_KEYWORDS = _GROUPING | frozenset(["and", "or", "unless", "bool", "offset"])
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    |(?P<range>\[[^\]]*\])
    |(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|s|m|h|d|w|y)?)
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}])
    """,
    re.VERBOSE,
)
_GRAFANA = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_TEMPLATE = re.compile(r"\{\{\s*\$?(?:labels\.)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


class PromQLError(ValueError):
    """The expression could not be read; the message quotes it."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...] = ()


@dataclass
class Expression:
    text: str
    selectors: list[Selector] = field(default_factory=list)
    grouping: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    """(`by`/`on`/..., the labels named)."""
    functions: list[str] = field(default_factory=list)

    @property
    def metrics(self) -> set[str]:
        return {s.metric for s in self.selectors}


def read(text: str) -> Expression:
    """The selectors, groupings and functions of one expression (Grafana's `$__rate_interval`
    and `$job`-like variables substituted); PromQLError on what it cannot read."""
    for name, value in _GRAFANA.items():
        text = text.replace(name, value)
    text = re.sub(r"\$\{?[a-zA-Z_]+\}?", ".*", text)
    tokens = _tokens(text)
    out = Expression(text)
    depth = 0
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and value in _GROUPING:
            if following == "(":
                labels, i = _label_list(tokens, i + 2, text)
                out.grouping.append((value, labels))
                continue
            if value in ("group_left", "group_right"):
                out.grouping.append((value, ()))
        elif kind == "ident" and value in _KEYWORDS:
            pass
        elif kind == "ident" and value in AGGREGATIONS and following in ("(", "by", "without"):
            out.functions.append(value)
        elif kind == "ident" and following == "(":
            if value not in FUNCTIONS:
                raise PromQLError(f"unknown function {value!r} in {text!r}")
            out.functions.append(value)
        elif kind == "ident":
            matchers: tuple[Matcher, ...] = ()
            if following == "{":
                matchers, i = _matchers(tokens, i + 2, text)
                out.selectors.append(Selector(value, matchers))
                continue
            out.selectors.append(Selector(value))
        elif value == "(":
            depth += 1
        elif value == ")":
            depth -= 1
            if depth < 0:
                raise PromQLError(f"unbalanced ) in {text!r}")
        i += 1
    if depth:
        raise PromQLError(f"unbalanced ( in {text!r}")
    return out


def template_labels(text: str) -> set[str]:
    """Labels a legend (`{{hook}}`) or an alert's annotation (`{{ $labels.hook }}`) names."""
    return {name for name in _TEMPLATE.findall(text) if name not in ("value", "labels")}


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise PromQLError(f"cannot read {text[pos : pos + 20]!r} in {text!r}")
        pos = match.end()
        kind = match.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, match.group()))
    return tokens


def _label_list(tokens: list[tuple[str, str]], i: int, text: str) -> tuple[tuple[str, ...], int]:
    labels = []
    while i < len(tokens) and tokens[i][1] != ")":
        kind, value = tokens[i]
        if kind == "ident":
            labels.append(value)
        elif value != ",":
            raise PromQLError(f"{value!r} in a label list of {text!r}")
        i += 1
    return tuple(labels), i + 1


def _matchers(tokens: list[tuple[str, str]], i: int, text: str) -> tuple[tuple[Matcher, ...], int]:
    matchers = []
    while i < len(tokens) and tokens[i][1] != "}":
        if tokens[i][1] == ",":
            i += 1
            continue
        try:
            (label_kind, label), (_, op), (value_kind, value) = tokens[i : i + 3]
        except ValueError:
            raise PromQLError(f"a matcher cut short in {text!r}") from None
        if label_kind != "ident" or op not in ("=", "!=", "=~", "!~") or value_kind != "string":
            raise PromQLError(f"not a matcher: {label} {op} {value} in {text!r}")
        matchers.append(Matcher(label, op, value[1:-1]))
        i += 3
    return tuple(matchers), i + 1
