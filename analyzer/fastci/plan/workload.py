"""Workload overrides and constraints, checked by FastCI itself (never ``eval``).

A test declares a full workload (dimension -> value), floors for the
dimensions a plan may reduce, and constraints between dimensions such as
``num_layers % pp == 0``. :func:`override_problems` says why a plan's
overrides cannot apply (empty list: they can); the Bazel rules run the same
checks in Starlark (``rules/private/constraints.bzl``,
``rules/private/plan_model.bzl``), and one shared corpus of cases
(``rules/tests/constraint_cases.json``) keeps the two in step.

Constraint language (a safe subset of Python expressions):

- literals: ints, floats, ``'strings'`` / ``"strings"`` (no escapes),
  ``True``, ``False``; names are workload dimensions;
- ``+ - * / // %`` on numbers (``/`` is true division; ``//`` and ``%`` floor
  like Python), unary ``-`` and ``+``;
- ``== != < <= > >=`` between two numbers, two strings (or, for ``==`` and
  ``!=``, two bools); a chained comparison (``a < b < c``) is an error;
- ``not``, ``and``, ``or`` on bools, short-circuit (an error in the right
  operand is ignored when the left one decides);
- ``min(a, b, ...)``, ``max(a, b, ...)``, ``abs(x)`` on numbers; parentheses.

Anything else (unknown names, ``**``, attribute access, other calls) is an
error, and a constraint must evaluate to a bool. The expression is compiled to
reverse Polish notation by a shunting-yard pass, then run on a value stack:
no recursion, so the Starlark twin is the same algorithm line for line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, Union

from fastci.errors import FastCIError
from fastci.types import WorkloadValue

__all__ = [
    "ConstraintError",
    "Constraint",
    "parse_constraint",
    "evaluate",
    "constraint_problems",
    "override_problems",
    "type_name",
    "CHECKS",
    "REFERENCES",
    "DEFAULT_CHECK",
    "DEFAULT_REFERENCE",
    "ReductionDecl",
    "Reduction",
    "reduction_problems",
    "resolve_reduction",
    "reducible_dims",
]


class ConstraintError(FastCIError):
    """A constraint cannot be parsed or evaluated."""


_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
_ARITHMETIC = ("+", "-", "*", "/", "//", "%")
# Binding strength of binary operators (higher binds tighter), as in Python.
_BINARY_PREC = {"or": 1, "and": 2, "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
                "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6}
_UNARY_PREC = {"not": 3, "-": 7, "+": 7}
# Function name -> (minimum, maximum) number of arguments.
_FUNCTIONS = {"min": (2, 64), "max": (2, 64), "abs": (1, 1)}
_KEYWORDS = {"and", "or", "not"}
_UNSUPPORTED_WORDS = {"None", "in", "is", "if", "else", "lambda", "for", "true", "false", "null"}
_TWO_CHAR_OPS = ("//", "==", "!=", "<=", ">=", "**")
_ONE_CHAR_OPS = "+-*/%<>(),"
_DIGITS = "0123456789"
_IDENT_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_IDENT_REST = _IDENT_START + _DIGITS

Scalar = Union[int, float, str, bool]
# An RPN item: (kind, payload, argc); kind is const, name, unary, binary or call.
_Item = tuple[str, Scalar, int]
_Token = tuple[str, Scalar]


def type_name(value: object) -> str:
    """The language-neutral type name used in messages (int, float, string, bool)."""
    if type(value) is bool:
        return "bool"
    if type(value) is int:
        return "int"
    if type(value) is float:
        return "float"
    if type(value) is str:
        return "string"
    return type(value).__name__


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _scan_number(expr: str, i: int) -> tuple[_Token, int]:
    j = i
    while j < len(expr) and expr[j] in _DIGITS:
        j += 1
    is_float = False
    if j < len(expr) and expr[j] == ".":
        is_float = True
        j += 1
        while j < len(expr) and expr[j] in _DIGITS:
            j += 1
    if j < len(expr) and expr[j] in "eE":
        k = j + 1
        if k < len(expr) and expr[k] in "+-":
            k += 1
        if k >= len(expr) or expr[k] not in _DIGITS:
            raise ConstraintError(f"malformed number at column {i + 1}")
        is_float = True
        j = k
        while j < len(expr) and expr[j] in _DIGITS:
            j += 1
    if j < len(expr) and expr[j] in _IDENT_REST + ".":
        raise ConstraintError(f"malformed number at column {i + 1}")
    text = expr[i:j]
    if is_float:
        return ("num", float(text)), j
    if len(text) > 1 and text[0] == "0":
        raise ConstraintError(f"number {text} has a leading zero (column {i + 1})")
    return ("num", int(text)), j


def tokenize(expr: str) -> list[_Token]:
    """Split ``expr`` into tokens: (kind, value) with kind num, str, name, op or end.

    Raises:
        ConstraintError: an unexpected character, bad number or unclosed string.
    """
    tokens: list[_Token] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in " \t\r\n":
            i += 1
        elif c in _DIGITS or (c == "." and i + 1 < len(expr) and expr[i + 1] in _DIGITS):
            token, i = _scan_number(expr, i)
            tokens.append(token)
        elif c in _IDENT_START:
            j = i
            while j < len(expr) and expr[j] in _IDENT_REST:
                j += 1
            word = expr[i:j]
            if word in ("True", "False"):
                tokens.append(("bool", word == "True"))
            elif word in _KEYWORDS:
                tokens.append(("op", word))
            elif word in _UNSUPPORTED_WORDS:
                raise ConstraintError(f"unsupported word {word!r} (column {i + 1})")
            else:
                tokens.append(("name", word))
            i = j
        elif c in "'\"":
            end = expr.find(c, i + 1)
            if end < 0:
                raise ConstraintError(f"unclosed string starting at column {i + 1}")
            text = expr[i + 1 : end]
            if "\\" in text:
                raise ConstraintError(f"escape sequences are not supported in strings (column {i + 1})")
            tokens.append(("str", text))
            i = end + 1
        elif expr[i : i + 2] in _TWO_CHAR_OPS:
            if expr[i : i + 2] == "**":
                raise ConstraintError(f"unsupported operator ** (column {i + 1})")
            tokens.append(("op", expr[i : i + 2]))
            i += 2
        elif c in _ONE_CHAR_OPS:
            tokens.append(("op", c))
            i += 1
        else:
            raise ConstraintError(f"unexpected character {c!r} (column {i + 1})")
    return tokens


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: its text, RPN program and the names it reads."""

    text: str
    program: tuple[_Item, ...]
    names: tuple[str, ...]


def parse_constraint(expr: str) -> Constraint:
    """Compile ``expr`` to reverse Polish notation (shunting-yard).

    Raises:
        ConstraintError: the expression is not in the constraint language.
    """
    if type(expr) is not str:
        raise ConstraintError(f"a constraint must be a string, got {type_name(expr)}")
    tokens = tokenize(expr)
    yard = _Yard()
    for k, (kind, value) in enumerate(tokens):
        nxt = tokens[k + 1] if k + 1 < len(tokens) else ("end", "")
        if kind in ("num", "str", "bool", "name"):
            yard.operand(kind, value, nxt)
        elif value == "(":
            yard.open_paren()
        elif value == ")":
            yard.close_paren()
        elif value == ",":
            yard.comma()
        else:
            yard.operator(value)
    return Constraint(expr, yard.finish(bool(tokens)), tuple(yard.names))


class _Yard:
    """The shunting-yard state of :func:`parse_constraint`: the output program, the
    operator stack, the argument count of each open call, the names read, and whether
    an operand comes next. One method per kind of token."""

    def __init__(self) -> None:
        self.out: list[_Item] = []
        # Operator stack entries: (kind, op, precedence); kind is unary, binary,
        # "(" or "call(" (a call's parenthesis; op is the function's name).
        self.ops: list[tuple[str, Scalar, int]] = []
        self.argc: list[int] = []
        self.names: list[str] = []
        self.expect_operand = True
        self.call_paren = False  # the next token is the "(" of a call

    def operand(self, kind: str, value: Scalar, nxt: _Token) -> None:
        """A number, string, boolean or name (a name before "(" is a call)."""
        if not self.expect_operand:
            raise ConstraintError(f"expected an operator before {value!r}")
        if kind == "name" and nxt == ("op", "("):
            if value not in _FUNCTIONS:
                raise ConstraintError(f"unknown function {value}() (allowed: abs, max, min)")
            self.ops.append(("call(", value, 0))
            self.argc.append(1)
            self.call_paren = True
            return
        if kind == "name":
            self.out.append(("name", value, 0))
            if value not in self.names:
                self.names.append(str(value))
        else:
            self.out.append(("const", value, 0))
        self.expect_operand = False

    def open_paren(self) -> None:
        if self.call_paren:
            self.call_paren = False  # already on the stack as the call's "call(" entry
            return
        if not self.expect_operand:
            raise ConstraintError("unexpected '(' after a value (only abs, max and min can be called)")
        self.ops.append(("(", "(", 0))

    def close_paren(self) -> None:
        if self.expect_operand:
            raise ConstraintError("unexpected ')'")
        self._pop_until_paren()
        if not self.ops:
            raise ConstraintError("unbalanced ')'")
        open_kind, fname, _ = self.ops.pop()
        if open_kind == "call(":
            n = self.argc.pop()
            low, high = _FUNCTIONS[str(fname)]
            if n < low or n > high:
                raise ConstraintError(f"{fname}() takes {low}{'' if low == high else ' or more'} arguments, got {n}")
            self.out.append(("call", fname, n))

    def comma(self) -> None:
        if self.expect_operand:
            raise ConstraintError("unexpected ','")
        self._pop_until_paren()
        if not self.ops or self.ops[-1][0] != "call(":
            raise ConstraintError("',' outside a function call")
        self.argc[-1] += 1
        self.expect_operand = True

    def operator(self, value: Scalar) -> None:
        """A unary operator where an operand is expected, else a binary one."""
        if self.expect_operand:
            if value not in _UNARY_PREC:
                raise ConstraintError(f"expected a value, got {value!r}")
            self.ops.append(("unary", value, _UNARY_PREC[str(value)]))
            return
        if value not in _BINARY_PREC:
            raise ConstraintError(f"unexpected {value!r} after a value")
        prec = _BINARY_PREC[str(value)]
        while self.ops and self.ops[-1][0] in ("unary", "binary") and self.ops[-1][2] >= prec:
            if prec == 4 and self.ops[-1][2] == 4:
                raise ConstraintError("chained comparison: write 'a < b and b < c'")
            top_kind, op, _ = self.ops.pop()
            self.out.append((top_kind, op, 0))
        self.ops.append(("binary", value, prec))
        self.expect_operand = True

    def finish(self, any_tokens: bool) -> tuple[_Item, ...]:
        """The program, once every token was read."""
        if self.expect_operand:
            raise ConstraintError("unexpected end of expression" if any_tokens
                                  else "empty expression")
        while self.ops:
            kind, op, _ = self.ops.pop()
            if kind in ("(", "call("):
                raise ConstraintError("unclosed '('")
            self.out.append((kind, op, 0))
        return tuple(self.out)

    def _pop_until_paren(self) -> None:
        while self.ops and self.ops[-1][0] not in ("(", "call("):
            kind, op, _ = self.ops.pop()
            self.out.append((kind, op, 0))


class _Err:
    """An evaluation error carried on the stack (dropped by a short-circuit)."""

    __slots__ = ("msg",)

    def __init__(self, msg: str) -> None:
        self.msg = msg


_Value = Union[Scalar, _Err]


def _num(value: Scalar) -> int | float:
    assert not isinstance(value, str)  # callers check _is_number first
    return value


def _arith(op: str, a: Scalar, b: Scalar) -> _Value:
    if not _is_number(a) or not _is_number(b):
        return _Err(f"unsupported operand types for {op}: {type_name(a)} and {type_name(b)}")
    x, y = _num(a), _num(b)
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    if y == 0:
        return _Err(f"division by zero in {op}")
    if op == "/":
        return float(x) / float(y)
    if op == "//":
        return x // y
    return x % y


def _compare(op: str, a: Scalar, b: Scalar) -> _Value:
    same = (_is_number(a) and _is_number(b)) or (type(a) is str and type(b) is str)
    if op in ("==", "!="):
        if not same and not (type(a) is bool and type(b) is bool):
            return _Err(f"cannot compare {type_name(a)} and {type_name(b)} with {op}")
        return (a == b) == (op == "==")
    if not same:
        return _Err(f"cannot order {type_name(a)} and {type_name(b)} with {op}")
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def _binary(op: str, a: _Value, b: _Value) -> _Value:
    if op in ("and", "or"):
        if isinstance(a, _Err):
            return a
        if type(a) is not bool:
            return _Err(f"{op} needs booleans, got {type_name(a)}")
        if a == (op == "or"):
            return a  # decided by the left operand: the right one is not evaluated
        if isinstance(b, _Err):
            return b
        if type(b) is not bool:
            return _Err(f"{op} needs booleans, got {type_name(b)}")
        return b
    if isinstance(a, _Err):
        return a
    if isinstance(b, _Err):
        return b
    if op in _ARITHMETIC:
        return _arith(op, a, b)
    return _compare(op, a, b)


def _unary(op: str, a: _Value) -> _Value:
    if isinstance(a, _Err):
        return a
    if op == "not":
        return (not a) if type(a) is bool else _Err(f"not needs a boolean, got {type_name(a)}")
    if not _is_number(a):
        return _Err(f"unary {op} needs a number, got {type_name(a)}")
    return -_num(a) if op == "-" else a


def _call(name: str, args: Sequence[_Value]) -> _Value:
    for arg in args:
        if isinstance(arg, _Err):
            return arg
        if not _is_number(arg):
            return _Err(f"{name}() needs numbers, got {type_name(arg)}")
    nums = [a for a in args if not isinstance(a, _Err)]
    if name == "abs":
        return abs(nums[0])  # type: ignore[arg-type]
    best = nums[0]
    for n in nums[1:]:
        if (n < best) if name == "min" else (n > best):  # type: ignore[operator]
            best = n
    return best


def run_program(constraint: Constraint, workload: Mapping[str, WorkloadValue]) -> bool:
    """Evaluate a compiled constraint on ``workload``.

    Raises:
        ConstraintError: an unknown name, a type error, a division by zero, or
            a result that is not a bool.
    """
    for name in constraint.names:
        if name not in workload:
            known = ", ".join(sorted(workload)) or "none"
            raise ConstraintError(f"unknown name {name!r} (workload dimensions: {known})")
    stack: list[_Value] = []
    for kind, payload, n in constraint.program:
        if kind == "const":
            stack.append(payload)
        elif kind == "name":
            stack.append(workload[str(payload)])
        elif kind == "unary":
            stack.append(_unary(str(payload), stack.pop()))
        elif kind == "binary":
            b = stack.pop()
            a = stack.pop()
            stack.append(_binary(str(payload), a, b))
        else:
            args = stack[len(stack) - n :]
            del stack[len(stack) - n :]
            stack.append(_call(str(payload), args))
    result = stack[0]
    if isinstance(result, _Err):
        raise ConstraintError(result.msg)
    if type(result) is not bool:
        raise ConstraintError(f"evaluates to {type_name(result)}, not a bool")
    return result


def evaluate(expr: str, workload: Mapping[str, WorkloadValue]) -> bool:
    """Parse and evaluate one constraint on ``workload``.

    Raises:
        ConstraintError: the constraint cannot be parsed or evaluated.
    """
    return run_program(parse_constraint(expr), workload)


def _render(value: WorkloadValue) -> str:
    """A value in a message: strings JSON-quoted (one line, same as the Starlark twin)."""
    if type(value) is str:
        return json.dumps(value, ensure_ascii=False)
    if type(value) is bool:
        return "True" if value else "False"
    return str(value)


def constraint_problems(constraints: Sequence[str], workload: Mapping[str, WorkloadValue]) -> list[str]:
    """One line per constraint that fails or cannot be evaluated on ``workload``."""
    problems = []
    for text in constraints:
        try:
            ok = evaluate(text, workload)
        except ConstraintError as exc:
            problems.append(f'constraint "{text}" cannot be evaluated: {exc}')
            continue
        if not ok:
            problems.append(f'constraint "{text}" does not hold')
    return problems


def override_problems(
    workload: Mapping[str, WorkloadValue],
    floors: Mapping[str, int | float],
    constraints: Sequence[str],
    overrides: Mapping[str, WorkloadValue],
) -> list[str]:
    """Why ``overrides`` cannot apply to a test's workload (empty list: they can).

    Only a dimension with a floor is reducible (no floor = frozen: it is what
    the test validates); its override must have the full value's type (an int
    is accepted for a float dimension) and lie in ``floor <= value <= full``.
    When every override is acceptable, each constraint must hold on the
    reduced workload.
    """
    problems = []
    for dim in sorted(overrides):
        value = overrides[dim]
        if dim not in workload:
            problems.append(f"{dim}: not a declared dimension")
            continue
        full = workload[dim]
        if dim not in floors:
            problems.append(f"{dim}: frozen (no floor declared), stays {_render(full)}")
            continue
        if type(full) is float and type(value) is int:
            value = float(value)
        if type(value) is not type(full):
            problems.append(f"{dim}: expected {type_name(full)} like the full value, got {type_name(value)}")
        elif value < floors[dim]:  # type: ignore[operator]
            problems.append(f"{dim}: {_render(value)} is below its floor {_render(floors[dim])}")
        elif value > full:  # type: ignore[operator]
            problems.append(f"{dim}: {_render(value)} is above the full value {_render(full)}")
    if problems or not overrides:
        return problems
    reduced = _merged(workload, overrides)
    at = ", ".join(f"{d}={_render(reduced[d])}" for d in sorted(overrides))
    return [f"{p} at {at}" for p in constraint_problems(constraints, reduced)]


def _merged(workload: Mapping[str, WorkloadValue], overrides: Mapping[str, WorkloadValue]) -> dict[str, WorkloadValue]:
    out = dict(workload)
    for dim, value in overrides.items():
        out[dim] = float(value) if type(workload[dim]) is float else value
    return out


# --- Reduction declarations: which dimensions may shrink, which are frozen ----------
#
# The twin of rules/private/validate.bzl (check_declaration, resolve_reduction);
# rules/tests/declaration_cases.json holds both to the same cases. Messages are
# "<attribute>: <problem>", the attribute named as in gpu_test.

#: Strength of a test's check, strongest first; "performance" is never reduced.
CHECKS = ("exact", "tolerance", "threshold", "completes", "performance")
#: "relational": compares runs made inside the test (meaningful at any workload);
#: "absolute": fixed numbers recorded at one workload (goldens, thresholds).
REFERENCES = ("relational", "absolute")
#: The safe sides when a test does not say: the weakest check (pruning never
#: prefers an undeclared test as a stand-in), and an absolute reference (a plan
#: reduces the test only to workloads with a recorded reference, else not at all).
DEFAULT_CHECK = "completes"
DEFAULT_REFERENCE = "absolute"


class ReductionDecl(Protocol):
    """A test's workload declaration: a gpu_test's ``TestDecl`` or a pytest marker's.

    ``frozen``, ``check`` and ``reference`` are read when the object has them;
    absent or None means undeclared (the defaults apply). A None workload (a
    test that declares none) is a problem: nothing of it may shrink.
    """

    @property
    def workload(self) -> Mapping[str, Any] | None: ...

    @property
    def floors(self) -> Mapping[str, Any]: ...

    @property
    def scope(self) -> Sequence[str]: ...

    @property
    def constraints(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Reduction:
    """What a declaration lets a plan do, defaults applied (see :func:`resolve_reduction`)."""

    frozen: tuple[str, ...]
    check: str
    reference: str
    #: Which of frozen, check and reference were undeclared (sorted).
    defaulted: tuple[str, ...]


def _r(value: object) -> str:
    """A value in a message the way Starlark's ``%r`` writes it."""
    if type(value) is str:
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_r(v) for v in value) + "]"
    return repr(value)


def _star_type(value: object) -> str:
    """Starlark's ``type()`` name of a value (list for lists and tuples, as Bazel passes both)."""
    if type(value) in (list, tuple):
        return "list"
    if isinstance(value, Mapping):
        return "dict"
    return type_name(value)


def _is_dim_name(s: object) -> bool:
    return isinstance(s, str) and bool(s) and s[0] in _IDENT_START and all(c in _IDENT_REST for c in s)


def _string_list_problems(attr: str, value: object) -> list[str]:
    if not isinstance(value, (list, tuple)):
        return [f"{attr}: expected a list of strings, got {_star_type(value)}"]
    seen: set[str] = set()
    item: object
    for i, item in enumerate(value):
        if type(item) is not str:
            return [f"{attr}: item {i}: expected a string, got {_star_type(item)} {_r(item)}"]
        if not item:
            return [f"{attr}: item {i}: empty string"]
        if item in seen:
            return [f"{attr}: duplicate item {_r(item)}"]
        seen.add(item)
    return []


def _workload_problems(workload: object, floors: object) -> list[str]:
    """The twin of validate.bzl ``check_workload`` (first problem only, like Starlark)."""
    if not isinstance(workload, Mapping):
        return [f"workload: expected a dict of dimension -> value, got {_star_type(workload)}"]
    for dim, value in workload.items():
        if not _is_dim_name(dim):
            return [f"workload: dimension {_r(dim)} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"]
        if type(value) not in (int, float, str, bool):
            return [f"workload: {dim}: expected int, float, string or bool, got {_star_type(value)}"]
    if not isinstance(floors, Mapping):
        return [f"floors: expected a dict of dimension -> minimum, got {_star_type(floors)}"]
    for dim, floor in floors.items():
        if dim not in workload:
            known = ", ".join(sorted(workload)) or "empty"
            return [f"floors: dimension {_r(dim)} is not in workload ({known})"]
        full = workload[dim]
        if not _is_number(full):
            return [f"floors: {dim}: a floor needs a numeric workload value, got {_star_type(full)} {_r(full)}"]
        if not _is_number(floor):
            return [f"floors: {dim}: expected a number, got {_star_type(floor)} {_r(floor)}"]
        if type(full) is int and type(floor) is not int:
            return [f"floors: {dim}: the workload value is an int, the floor must be too (got {_r(floor)})"]
        if floor > full:
            return [f"floors: {dim}: floor {_r(floor)} is above the full value {_r(full)}"]
        if floor <= 0:
            return [f"floors: {dim}: floor {_r(floor)} must be > 0"]
    return []


def _full_constraint_problems(workload: Mapping[str, WorkloadValue], constraints: Sequence[str]) -> list[str]:
    """The twin of validate.bzl ``check_constraints``: each parses and holds on the full workload."""
    for text in constraints:
        try:
            ok = evaluate(text, workload)
        except ConstraintError as exc:
            return [f"constraints: {_r(text)}: {exc}"]
        if not ok:
            return [f"constraints: {_r(text)} does not hold on the full workload"]
    return []


def _reduction_attr_problems(workload: Mapping[str, Any], floors: Mapping[str, Any], frozen: object,
                             check: object, reference: object) -> list[str]:
    """The twin of validate.bzl ``check_reduction``."""
    if frozen is not None:
        problems = _string_list_problems("frozen", frozen)
        if problems:
            return problems
        names = list(frozen)  # type: ignore[call-overload]
        for dim in names:
            if dim not in workload:
                known = ", ".join(sorted(workload)) or "empty"
                return [f"frozen: dimension {_r(dim)} is not in workload ({known})"]
            if dim in floors:
                return [f"frozen: {dim} has a floor: a dimension shrinks to its floor or is frozen, not both"]
        for dim in sorted(workload):
            if dim not in floors and dim not in names:
                return [f"frozen: {dim} has no floor and is not frozen: give it a floor or list it in frozen"]
    for attr, value, allowed in (("check", check, CHECKS), ("reference", reference, REFERENCES)):
        if value is not None and (type(value) is not str or value not in allowed):
            return [f"{attr}: expected one of {', '.join(allowed)}, got {_r(value)}"]
    if check == "performance" and floors:
        return [f"check: a performance check is never reduced: it takes no floors (got {', '.join(sorted(floors))})"]
    return []


def reduction_problems(decl: ReductionDecl) -> list[str]:
    """Why ``decl`` is not a valid workload declaration (empty list: it is valid).

    The same rules, in the same order and words, as a gpu_test's load-time
    checks (``rules/private/validate.bzl`` ``check_declaration``), so a test
    declared by a pytest marker is held to what Bazel enforces: dimension names
    and scalar values; numeric floors with ``0 < floor <= full``; ``scope`` and
    ``constraints`` lists of strings; each constraint parses and holds on the
    full workload (FastCI's evaluator, never ``eval``); a declared ``frozen``
    puts every dimension in exactly one of floors and frozen; ``check`` in
    :data:`CHECKS`, ``reference`` in :data:`REFERENCES`; a performance check
    takes no floors. Returns the first problem, like the rules.
    """
    workload, floors = decl.workload, decl.floors
    problems = _workload_problems(workload, floors)
    if problems or workload is None:
        return problems
    problems = (_string_list_problems("scope", decl.scope) or _string_list_problems("constraints", decl.constraints)
                or _full_constraint_problems(workload, decl.constraints))
    if problems:
        return problems
    return _reduction_attr_problems(workload, floors, getattr(decl, "frozen", None), getattr(decl, "check", None),
                                    getattr(decl, "reference", None))


def resolve_reduction(decl: ReductionDecl) -> Reduction:
    """``decl``'s frozen dimensions, check and reference with defaults applied (the twin of
    validate.bzl ``resolve_reduction``); assumes :func:`reduction_problems` found none.

    ``defaulted`` names the attributes that are None here or that ``decl.defaulted``
    (a ``TestDecl``'s, whose values the rules already resolved) names.
    """
    frozen, check, reference = (getattr(decl, "frozen", None), getattr(decl, "check", None),
                                getattr(decl, "reference", None))
    workload = decl.workload or {}
    # A TestDecl from bazel query carries resolved values and names the defaulted ones.
    already = getattr(decl, "defaulted", ())
    defaulted = tuple(name for name, value in (("check", check), ("frozen", frozen), ("reference", reference))
                      if value is None or name in already)
    return Reduction(
        frozen=tuple(sorted(frozen if frozen is not None else (d for d in workload if d not in decl.floors))),
        check=check if check is not None else DEFAULT_CHECK,
        reference=reference if reference is not None else DEFAULT_REFERENCE,
        defaulted=defaulted,
    )


def reducible_dims(decl: ReductionDecl) -> dict[str, tuple[int | float, int | float]]:
    """Dimension -> (floor, full) for each dimension a plan may shrink, sorted by name.

    Empty, on the safe side, when the declaration has a problem or its check is
    ``performance``. Frozen dimensions are never included. An ``absolute``
    reference still lists its dimensions: the planner may reduce them only to
    workloads with a recorded reference.
    """
    workload = decl.workload
    if workload is None or reduction_problems(decl) or resolve_reduction(decl).check == "performance":
        return {}
    return {dim: (decl.floors[dim], workload[dim]) for dim in sorted(decl.floors)}


# --- Calibration ladder ---------------------------------------------------------------


def ladder(decl: ReductionDecl) -> list[tuple[str, dict[str, WorkloadValue]]]:
    """The rungs ``fastci calibrate`` runs a test at: (name, overrides), smallest
    reductions last.

    The full workload (``full``, no overrides); every reducible dimension at its floor
    together (``floors``); each reducible dimension alone at its floor
    (``dim=floor``); and each alone at the midpoint between floor and full
    (``dim=mid``, rounded down for integers). A rung that breaks a constraint, or
    repeats another rung's workload, is left out. Nothing of a test with no reducible
    dimension (:func:`reducible_dims`: frozen, performance check, invalid
    declaration) is run but ``full``.

    The order lets a calibration leave out a rung that an earlier, smaller one makes
    useless (:func:`fastci.plan.reduce.superseding_rung`): ``floors`` before the single
    floors, each floor before its midpoint.
    """
    workload = decl.workload or {}
    dims = reducible_dims(decl)
    rungs: list[tuple[str, dict[str, WorkloadValue]]] = [("full", {})]
    seen: set[str] = {"{}"}

    def add(name: str, overrides: dict[str, WorkloadValue]) -> None:
        key = json.dumps({d: v for d, v in overrides.items() if v != workload[d]},
                         sort_keys=True)
        if key in seen or override_problems(workload, decl.floors, decl.constraints, overrides):
            return
        seen.add(key)
        rungs.append((name, overrides))

    if len(dims) > 1:
        add("floors", {dim: floor for dim, (floor, _) in dims.items()})
    for dim, (floor, full) in dims.items():
        if floor != full:
            add(f"{dim}={_render(floor)}", {dim: floor})
    for dim, (floor, full) in dims.items():
        mid: WorkloadValue = (floor + full) // 2 if isinstance(full, int) else (floor + full) / 2
        if mid != full:
            add(f"{dim}={_render(mid)}", {dim: mid})
    return rungs
