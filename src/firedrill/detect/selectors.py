"""The series selectors of a PromQL expression: metric names and their label matchers.

A generated rule is inert on a real fleet when it selects a name, a label or an ``le`` value the
exporters there never emit, and nothing in Prometheus says so: the rule just never fires. Reading
the selectors back out of each expression lets rule generation decide which rules fit a fleet's
exporters and lets a test hold every generated rule to the reference lists. This reads the subset
of PromQL the generated rules use (functions, aggregations with ``by``/``without``, vector
matching with ``on``/``ignoring``/``group_*``, range selectors, numbers, strings); it is not a
PromQL parser and does not try to be one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Matcher", "Selector", "SelectorError", "selectors"]


class SelectorError(ValueError):
    """An expression this reader cannot follow."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]

    def value_of(self, label: str) -> str | None:
        """The value an equality matcher fixes for ``label`` (None without one)."""
        for m in self.matchers:
            if m.label == label and m.op == "=":
                return m.value
        return None


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<range>\[[^\]]*\])
    | (?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<id>[a-zA-Z_:][a-zA-Z0-9_:]*)
    | (?P<op>==|!=|=~|!~|>=|<=|[-+*/%^(){},=<>])
    )""",
    re.VERBOSE,
)
_LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "inf", "nan"}) | _LABEL_LISTS


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise SelectorError(f"cannot read PromQL at {expr[pos : pos + 20]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), body)


def selectors(expr: str) -> list[Selector]:
    """Every series selector in ``expr``, in order of appearance."""
    toks = _tokens(expr)
    out: list[Selector] = []
    i = 0
    n = len(toks)
    while i < n:
        kind, text = toks[i]
        nxt = toks[i + 1] if i + 1 < n else ("", "")
        if kind == "id" and text.lower() in _LABEL_LISTS:
            if nxt == ("op", "("):  # a label list: skip to its ")"
                j = i + 2
                while j < n and toks[j] != ("op", ")"):
                    j += 1
                i = j + 1
                continue
            i += 1
            continue
        if kind == "id" and text.lower() in _KEYWORDS:
            i += 1
            continue
        if kind == "id" and nxt == ("op", "("):  # a function or an aggregation
            i += 1
            continue
        if kind == "id" and i + 1 < n and toks[i + 1][1].lower() in ("by", "without"):
            i += 1  # `sum by (...) (...)`: the aggregation's name
            continue
        if kind == "id" or (kind, text) == ("op", "{"):
            name = text if kind == "id" else ""
            j = i + 1 if kind == "id" else i
            matchers: list[Matcher] = []
            if j < n and toks[j] == ("op", "{"):
                j += 1
                while j < n and toks[j] != ("op", "}"):
                    if toks[j] == ("op", ","):
                        j += 1
                        continue
                    if j + 2 >= n or toks[j][0] != "id" or toks[j + 2][0] != "str":
                        raise SelectorError(f"cannot read the matchers of {name or '{...}'}")
                    matchers.append(Matcher(toks[j][1], toks[j + 1][1], _unquote(toks[j + 2][1])))
                    j += 3
                j += 1
            if not name:
                found = [m.value for m in matchers if m.label == "__name__" and m.op == "="]
                if not found:
                    raise SelectorError("a selector without a metric name")
                name = found[0]
            out.append(Selector(name, tuple(matchers)))
            i = j
            continue
        i += 1
    return out
