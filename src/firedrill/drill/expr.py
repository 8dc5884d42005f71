"""A PromQL subset for custom stop conditions and ``expr`` hypothesis clauses.

A drill's stop conditions are usually alerts that already exist, but sometimes the abort owner
wants one more guard ("abort if us-west-2's 5xx ratio passes 5%"), written the way the team
writes its Prometheus rules. This evaluator reads the world's series through the ``Signals``
port, so the same expression means the same thing on the twin and on a real Prometheus.

Supported: instant and range vector selectors with label matchers ``=``, ``!=``, ``=~``,
``!~`` (anchored, as in Prometheus); ``rate`` and ``increase`` (Prometheus 2.x extrapolation,
counter resets corrected); ``sum``/``avg``/``max``/``min``/``count`` with ``by``/``without``
(before or after the argument); ``histogram_quantile``; ``abs``; unary minus; ``+ - * /``
between scalars and vectors (vector-vector on identical label sets); comparisons
``> < >= <= == !=`` filter a vector (or give 1/0 between scalars). Parse errors say what was
expected and where (a caret under the column).

An expression "fires" when its value is a non-empty vector or a non-zero scalar.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from firedrill.detect.promql import bucket_quantile, series_increase
from firedrill.errors import FiredrillError
from firedrill.model.series import Labels
from firedrill.ports import Signals

Vector = dict[Labels, float]
Value = float | Vector

_UNITS_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_AGGREGATIONS = frozenset({"sum", "avg", "max", "min", "count"})
_FUNCTIONS = frozenset({"rate", "increase", "histogram_quantile", "abs"})
_COMPARISONS = (">=", "<=", "==", "!=", ">", "<")
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?![a-zA-Z_:]))
  | (?P<duration>[0-9]+(?:ms|s|m|h|d|w)(?![a-zA-Z0-9_]))
  | (?P<word>[0-9]+[a-zA-Z_][a-zA-Z0-9_]*)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>=~|!~|>=|<=|==|!=|[-+*/><=(){}\[\],])
    """,
    re.VERBOSE,
)


class ExprError(FiredrillError):
    """An expression that does not parse or cannot be evaluated; the message says where."""


# --- the tree -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    value: float


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str

    def matches(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        hit = re.fullmatch(self.value, have) is not None
        return hit if self.op == "=~" else not hit


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[Matcher, ...]
    range_s: float | None = None


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Aggregate:
    op: str
    expr: Node
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Binary:
    op: str
    lhs: Node
    rhs: Node


@dataclass(frozen=True)
class Negate:
    expr: Node


Node = Number | Selector | Call | Aggregate | Binary | Negate


# --- parsing --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _error(text, pos, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


def _error(text: str, pos: int, message: str) -> ExprError:
    return ExprError(f"{message} at column {pos + 1}:\n  {text}\n  {' ' * pos}^")


def _duration_s(tok: _Tok, text: str) -> float:
    m = re.fullmatch(r"([0-9]+)(ms|s|m|h|d|w)", tok.text)
    if m is None:
        raise _error(text, tok.pos, f"expected a duration like 5m, got {tok.text!r}")
    return int(m.group(1)) * _UNITS_S[m.group(2)]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> _Tok:
        if self.tok.text != text:
            got = self.tok.text or "the end"
            raise _error(self.text, self.tok.pos, f"expected '{text}', got {got!r}")
        return self.take()

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise _error(self.text, 0, "empty expression")
        node = self.comparison()
        if self.tok.kind != "end":
            raise _error(self.text, self.tok.pos, f"unexpected {self.tok.text!r}")
        return node

    def comparison(self) -> Node:
        node = self.additive()
        while self.tok.kind == "op" and self.tok.text in _COMPARISONS:
            op = self.take().text
            node = Binary(op, node, self.additive())
        return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while self.tok.text in ("+", "-") and self.tok.kind == "op":
            op = self.take().text
            node = Binary(op, node, self.multiplicative())
        return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while self.tok.text in ("*", "/") and self.tok.kind == "op":
            op = self.take().text
            node = Binary(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.tok.kind == "op" and self.tok.text == "-":
            self.take()
            return Negate(self.unary())
        if self.tok.kind == "op" and self.tok.text == "+":
            self.take()
            return self.unary()
        return self.primary()

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "number":
            self.take()
            return Number(float(tok.text))
        if tok.kind == "op" and tok.text == "(":
            self.take()
            node = self.comparison()
            self.expect(")")
            return node
        if tok.kind == "op" and tok.text == "{":
            raise _error(self.text, tok.pos, "a selector needs a metric name")
        if tok.kind != "ident":
            got = tok.text or "the end"
            raise _error(self.text, tok.pos, f"expected a number, a selector or '(', got {got!r}")
        name = tok.text
        if name in _AGGREGATIONS:
            return self.aggregate()
        if name in _FUNCTIONS and self.toks[self.i + 1].text == "(":
            return self.call()
        if self.toks[self.i + 1].text == "(":
            raise _error(self.text, tok.pos, f"unknown function {name!r}")
        return self.selector()

    def labels(self) -> tuple[str, ...]:
        self.expect("(")
        names: list[str] = []
        while self.tok.text != ")":
            if self.tok.kind != "ident":
                raise _error(self.text, self.tok.pos, "expected a label name")
            names.append(self.take().text)
            if self.tok.text == ",":
                self.take()
            elif self.tok.text != ")":
                raise _error(self.text, self.tok.pos, "expected ',' or ')'")
        self.take()
        return tuple(names)

    def aggregate(self) -> Node:
        op = self.take().text
        by: tuple[str, ...] | None = None
        without: tuple[str, ...] | None = None
        if self.tok.text == "by":
            self.take()
            by = self.labels()
        elif self.tok.text == "without":
            self.take()
            without = self.labels()
        self.expect("(")
        inner = self.comparison()
        self.expect(")")
        if by is None and without is None:
            if self.tok.text == "by":
                self.take()
                by = self.labels()
            elif self.tok.text == "without":
                self.take()
                without = self.labels()
        return Aggregate(op, inner, by, without)

    def call(self) -> Node:
        tok = self.take()
        self.expect("(")
        args: list[Node] = []
        while True:
            args.append(self.comparison())
            if self.tok.text == ",":
                self.take()
                continue
            break
        self.expect(")")
        want = {"rate": 1, "increase": 1, "abs": 1, "histogram_quantile": 2}[tok.text]
        if len(args) != want:
            raise _error(
                self.text, tok.pos, f"{tok.text} takes {want} argument(s), got {len(args)}"
            )
        if tok.text in ("rate", "increase"):
            arg = args[0]
            if not isinstance(arg, Selector) or arg.range_s is None:
                raise _error(self.text, tok.pos, f"{tok.text} needs a range selector like x[5m]")
        return Call(tok.text, tuple(args))

    def selector(self) -> Node:
        name = self.take().text
        matchers: list[Matcher] = []
        if self.tok.text == "{":
            self.take()
            while self.tok.text != "}":
                if self.tok.kind != "ident":
                    raise _error(self.text, self.tok.pos, "expected a label name")
                label = self.take().text
                if self.tok.text not in ("=", "!=", "=~", "!~"):
                    raise _error(self.text, self.tok.pos, "expected =, !=, =~ or !~")
                op = self.take().text
                if self.tok.kind != "string":
                    raise _error(self.text, self.tok.pos, "expected a quoted label value")
                raw = self.take().text[1:-1]
                value = re.sub(r"\\(.)", r"\1", raw)
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise _error(
                            self.text, self.tok.pos, f"bad regex {value!r}: {exc}"
                        ) from exc
                matchers.append(Matcher(label, op, value))
                if self.tok.text == ",":
                    self.take()
                elif self.tok.text != "}":
                    raise _error(self.text, self.tok.pos, "expected ',' or '}'")
            self.take()
        range_s: float | None = None
        if self.tok.text == "[":
            self.take()
            if self.tok.kind not in ("duration", "number", "word"):
                raise _error(self.text, self.tok.pos, "expected a duration like 5m")
            range_s = _duration_s(self.take(), self.text)
            self.expect("]")
        return Selector(name, tuple(matchers), range_s)


def parse(text: str) -> Node:
    """Parse an expression; an ``ExprError`` says what was expected and where."""
    return _Parser(text).parse()


# --- evaluation -----------------------------------------------------------------------------------


def _without(labels: Labels, drop: frozenset[str]) -> Labels:
    return tuple((k, v) for k, v in labels if k not in drop)


def _only(labels: Labels, keep: frozenset[str]) -> Labels:
    return tuple((k, v) for k, v in labels if k in keep)


def _split(matchers: tuple[Matcher, ...]) -> tuple[dict[str, str], list[Matcher]]:
    """Equality matchers go to the port; the rest are applied here."""
    eq: dict[str, str] = {}
    rest: list[Matcher] = []
    for m in matchers:
        if m.op == "=" and m.label not in eq and m.value != "":
            eq[m.label] = m.value
        else:
            rest.append(m)
    return eq, rest


class Evaluator:
    """Evaluates parsed expressions against a ``Signals`` port at its latest sample."""

    def __init__(self, signals: Signals, now_s: Callable[[], float]) -> None:
        self.signals = signals
        self.now_s = now_s

    def evaluate(self, node: Node) -> Value:
        match node:
            case Number(value=v):
                return v
            case Negate(expr=e):
                return _unary(self.evaluate(e), lambda x: -x)
            case Selector():
                if node.range_s is not None:
                    raise ExprError(f"a range selector ({node.name}[...]) needs rate or increase")
                return self._instant(node)
            case Call(func=f, args=args):
                return self._call(f, args)
            case Aggregate():
                return self._aggregate(node)
            case Binary(op=op, lhs=lhs, rhs=rhs):
                return _binary(op, self.evaluate(lhs), self.evaluate(rhs))
        raise ExprError(f"cannot evaluate {node!r}")

    def _instant(self, sel: Selector) -> Vector:
        eq, rest = _split(sel.matchers)
        _, labels, values = self.signals.instant(sel.name, eq)
        out: Vector = {}
        for lab, v in zip(labels, values, strict=True):
            if math.isfinite(float(v)) and all(m.matches(dict(lab)) for m in rest):
                out[lab] = float(v)
        return out

    def _range(self, sel: Selector, *, per_second: bool) -> Vector:
        assert sel.range_s is not None
        eq, rest = _split(sel.matchers)
        end = self.now_s()
        start = end - sel.range_s
        out: Vector = {}
        for s in self.signals.query(sel.name, eq, start_s=start, end_s=end):
            if not all(m.matches(dict(s.labels)) for m in rest):
                continue
            inc = series_increase(s.t_s.tolist(), s.values.tolist(), start, end)
            if math.isfinite(inc):
                out[s.labels] = inc / sel.range_s if per_second else inc
        return out

    def _call(self, func: str, args: tuple[Node, ...]) -> Value:
        if func in ("rate", "increase"):
            sel = args[0]
            assert isinstance(sel, Selector)
            return self._range(sel, per_second=func == "rate")
        if func == "abs":
            return _unary(self.evaluate(args[0]), abs)
        q = self.evaluate(args[0])
        if not isinstance(q, float):
            raise ExprError("histogram_quantile's first argument must be a scalar")
        vec = self.evaluate(args[1])
        if not isinstance(vec, dict):
            raise ExprError("histogram_quantile's second argument must be a vector")
        groups: dict[Labels, list[tuple[float, float]]] = {}
        for lab, v in vec.items():
            le = dict(lab).get("le")
            if le is None:
                continue
            bound = math.inf if le == "+Inf" else float(le)
            groups.setdefault(_without(lab, frozenset({"le"})), []).append((bound, v))
        out: Vector = {}
        for lab, buckets in groups.items():
            val = bucket_quantile(q, buckets)
            if not math.isnan(val):
                out[lab] = val
        return out

    def _aggregate(self, node: Aggregate) -> Vector:
        vec = self.evaluate(node.expr)
        if not isinstance(vec, dict):
            raise ExprError(f"{node.op}() needs a vector, not a scalar")
        groups: dict[Labels, list[float]] = {}
        for lab, v in vec.items():
            if node.by is not None:
                key = _only(lab, frozenset(node.by))
            elif node.without is not None:
                key = _without(lab, frozenset(node.without))
            else:
                key = ()
            groups.setdefault(key, []).append(v)
        out: Vector = {}
        for key, vals in groups.items():
            if node.op == "sum":
                out[key] = float(sum(vals))
            elif node.op == "avg":
                out[key] = float(sum(vals) / len(vals))
            elif node.op == "max":
                out[key] = max(vals)
            elif node.op == "min":
                out[key] = min(vals)
            else:
                out[key] = float(len(vals))
        return out


def _unary(v: Value, f: Callable[[float], float]) -> Value:
    if isinstance(v, dict):
        return {k: f(x) for k, x in v.items()}
    return f(v)


def _arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return math.inf if a > 0 else -math.inf if a < 0 else math.nan
    return a / b


def _compare(op: str, a: float, b: float) -> bool:
    return {
        ">": a > b,
        "<": a < b,
        ">=": a >= b,
        "<=": a <= b,
        "==": a == b,
        "!=": a != b,
    }[op]


def _binary(op: str, lhs: Value, rhs: Value) -> Value:
    comparison = op in _COMPARISONS
    if isinstance(lhs, float) and isinstance(rhs, float):
        if comparison:
            return 1.0 if _compare(op, lhs, rhs) else 0.0
        return _arith(op, lhs, rhs)
    if isinstance(lhs, dict) and isinstance(rhs, float):
        if comparison:
            return {k: v for k, v in lhs.items() if _compare(op, v, rhs)}
        return {k: _arith(op, v, rhs) for k, v in lhs.items()}
    if isinstance(lhs, float) and isinstance(rhs, dict):
        if comparison:
            return {k: v for k, v in rhs.items() if _compare(op, lhs, v)}
        return {k: _arith(op, lhs, v) for k, v in rhs.items()}
    assert isinstance(lhs, dict)
    assert isinstance(rhs, dict)
    out: Vector = {}
    for k, a in lhs.items():
        if k not in rhs:
            continue
        if comparison:
            if _compare(op, a, rhs[k]):
                out[k] = a
        else:
            out[k] = _arith(op, a, rhs[k])
    return out


def evaluate(text: str | Node, signals: Signals, now_s: Callable[[], float]) -> Value:
    """Parse (if needed) and evaluate ``text`` against ``signals`` at ``now_s()``."""
    node = parse(text) if isinstance(text, str) else text
    return Evaluator(signals, now_s).evaluate(node)


def fires(value: Value) -> bool:
    """An alerting expression fires when it returns any sample (or a non-zero scalar)."""
    if isinstance(value, dict):
        return bool(value)
    return value != 0.0 and not math.isnan(value)


def scalar_of(value: Value) -> float:
    """One number for a clause: the scalar, or the largest sample of a vector (NaN if empty)."""
    if isinstance(value, dict):
        return max(value.values()) if value else math.nan
    return value
