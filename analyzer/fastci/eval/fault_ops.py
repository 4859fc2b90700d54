"""The fault operators of :mod:`fastci.eval.faults`: where each one can edit a unit, and how.

:class:`SiteFinder` walks one unit's own code (:func:`fastci.eval.faults.own_code`) and
lists every site of every operator, in source order, with the edits it offers there;
:class:`ReplaceOne` makes one such edit. The operators themselves are described in
:mod:`fastci.eval.faults`. Nothing here checks that an edit compiles or changes the AST:
the caller (:func:`fastci.eval.faults.materialize`) does, and drops the ones that do not.
"""

from __future__ import annotations

from typing import Callable, Union

import libcst as cst

#: The operators, in the order a report lists them. The first five were the selection
#: benchmark's; later ones are appended, never inserted, so existing names keep their place.
OPERATORS = ("slice", "compare", "constant", "drop", "swap", "boolean", "reduction", "dtype")

#: What replaces a site's node: another node, or removal (``drop``).
Replacement = Union[cst.CSTNode, cst.RemovalSentinel]

#: One site: (operator, the node to replace, [(label, replacement), ...]).
Site = tuple[str, cst.CSTNode, list[tuple[str, Replacement]]]


# --------------------------------------------------------------------------- slice, constant


def _int_node(value: int) -> cst.BaseExpression:
    if value < 0:
        return cst.UnaryOperation(cst.Minus(), cst.Integer(str(-value)))
    return cst.Integer(str(value))


def _literal_int(node: cst.BaseExpression | None) -> int | None:
    """The value of ``n`` or ``-n`` written as a literal, else None."""
    if isinstance(node, cst.Integer) and not node.lpar:
        return int(node.value.replace("_", ""), 0)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) \
            and isinstance(node.expression, cst.Integer) and not node.lpar:
        return -int(node.expression.value.replace("_", ""), 0)
    return None


def _shift(node: cst.BaseExpression, delta: int) -> cst.BaseExpression:
    """``node`` plus ``delta`` (folded into a literal; otherwise ``(node) + 1``)."""
    value = _literal_int(node)
    if value is not None:
        return _int_node(value + delta)
    atom = isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) or bool(node.lpar)
    left = node if atom else node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    op: cst.BaseBinaryOp = cst.Add() if delta > 0 else cst.Subtract()
    return cst.BinaryOperation(left, op, cst.Integer(str(abs(delta))))


def _slice_variants(node: cst.Slice) -> list[tuple[str, Replacement]]:
    lo, hi = node.lower, node.upper
    out: list[tuple[str, Replacement]] = []
    if hi is not None and lo is None:
        out.append(("move the upper bound to the lower", node.with_changes(lower=hi, upper=None)))
        k = _literal_int(hi)
        if k is not None and k < 0:
            out.append(("mirror the bound", node.with_changes(lower=_int_node(-k), upper=None)))
    if lo is not None and hi is None:
        out.append(("move the lower bound to the upper", node.with_changes(lower=None, upper=lo)))
        k = _literal_int(lo)
        if k is not None and k > 0:
            out.append(("mirror the bound", node.with_changes(lower=None, upper=_int_node(-k))))
    if lo is not None and hi is not None:
        out.append(("drop the lower bound", node.with_changes(lower=None)))
        out.append(("drop the upper bound", node.with_changes(upper=None)))
    for field, bound in (("lower", lo), ("upper", hi)):
        if bound is not None:
            for delta in (1, -1):
                out.append((f"{field} bound {delta:+d}",
                            node.with_changes(**{field: _shift(bound, delta)})))
    return out


_FLIPS: dict[type[cst.BaseCompOp], Callable[[], cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot, cst.IsNot: cst.Is, cst.In: cst.NotIn, cst.NotIn: cst.In,
}


# --------------------------------------------------------------------------- reduction, dtype

#: Wrong reductions: the last name of a called function or method.
REDUCTION_CALLS = {"sum": "mean", "mean": "sum", "max": "min", "min": "max", "amax": "amin",
                   "amin": "amax", "all": "any", "any": "all", "nansum": "nanmean",
                   "nanmean": "nansum", "argmax": "argmin", "argmin": "argmax"}
#: Of those, the builtins: a bare name is mutated only into another builtin (``sum`` ->
#: ``mean`` would be a NameError, not a wrong reduction).
_BUILTIN_REDUCTIONS = {"max": "min", "min": "max", "all": "any", "any": "all"}
#: String values of a ``reduction=`` / ``reduce=`` / ``reduce_op=`` keyword.
REDUCTION_STRINGS = {"mean": "sum", "sum": "mean", "max": "min", "min": "max", "amax": "amin",
                     "amin": "amax"}
#: Attributes of ``ReduceOp`` (``dist.ReduceOp.SUM``).
REDUCE_OPS = {"SUM": "AVG", "AVG": "SUM", "MAX": "MIN", "MIN": "MAX"}

#: Wrong dtypes: an attribute name (``torch.bfloat16``, ``np.int64``) -> the wrong one.
DTYPE_ATTRS = {"float32": "float16", "float16": "float32", "bfloat16": "float16",
               "float64": "float32", "int64": "int32", "int32": "int64"}
#: Only as ``torch.long`` (``x.long`` is anything).
_TORCH_DTYPE_ATTRS = {"long": "int"}
#: String values of a keyword whose name holds ``dtype`` (``dtype="bf16"``).
DTYPE_STRINGS = {**DTYPE_ATTRS, "fp32": "fp16", "fp16": "fp32", "bf16": "fp16"}


def _last_name(node: cst.BaseExpression) -> str | None:
    """``c`` for ``c`` and ``a.b.c``, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


def _renamed_string(node: cst.BaseExpression, table: dict[str, str]) -> cst.SimpleString | None:
    """A plain string literal whose text is a key of ``table``, with the value's text instead."""
    if not isinstance(node, cst.SimpleString) or "b" in node.prefix.lower():
        return None
    new = table.get(node.raw_value)
    if new is None:
        return None
    return node.with_changes(value=f"{node.prefix}{node.quote}{new}{node.quote}")


def _parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def _or_operand(node: cst.BaseExpression) -> cst.BaseExpression:
    """An operand of an ``or`` about to become ``and``: parenthesized if it is an ``or``."""
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or) \
            and not node.lpar:
        return _parenthesized(node)
    return node


# --------------------------------------------------------------------------- the site finder


class SiteFinder(cst.CSTVisitor):
    """Collect every operator's sites inside one unit's own code, in source order.

    Visit each node of :func:`fastci.eval.faults.own_code` with it; :attr:`sites` then
    lists ``(operator, node, [(label, replacement), ...])``.
    """

    def __init__(self, docstring: cst.CSTNode | None) -> None:
        """Start empty.

        Args:
            docstring: the unit's docstring statement, never dropped (None: it has none).
        """
        super().__init__()
        self.docstring = docstring
        self.sites: list[Site] = []
        self._operands_of_and: set[cst.CSTNode] = set()

    def _add(self, operator: str, node: cst.CSTNode,
             variants: list[tuple[str, Replacement]]) -> None:
        if variants:
            self.sites.append((operator, node, variants))

    # Other units (nested defs and classes), annotations and imports are not this unit's
    # behaviour (an import's dotted name is not an attribute access).
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    # slice, compare, constant, drop, swap

    def visit_Slice(self, node: cst.Slice) -> None:
        self._add("slice", node, _slice_variants(node))

    def visit_ComparisonTarget(self, node: cst.ComparisonTarget) -> None:
        flip = _FLIPS.get(type(node.operator))
        if flip is not None:
            self._add("compare", node, [("flip", node.with_changes(operator=flip()))])

    def visit_Integer(self, node: cst.Integer) -> None:
        value = int(node.value.replace("_", ""), 0)
        variants: list[tuple[str, Replacement]] = [("+1", node.with_changes(value=str(value + 1)))]
        if value > 0:
            variants.append(("-1", node.with_changes(value=str(value - 1))))
        self._add("constant", node, variants)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        inert = all(isinstance(s, cst.Pass) or (isinstance(s, cst.Expr)
                    and isinstance(s.value, cst.Ellipsis)) for s in node.body)
        if node is not self.docstring and not inert:
            self._add("drop", node, [("drop", cst.RemovalSentinel.REMOVE)])

    def visit_Call(self, node: cst.Call) -> None:
        self._reduction_call(node)
        args = list(node.args)
        variants: list[tuple[str, Replacement]] = []
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            if a.keyword is None and b.keyword is None and not a.star and not b.star \
                    and not a.value.deep_equals(b.value):
                swapped = list(args)
                swapped[i] = a.with_changes(value=b.value)
                swapped[i + 1] = b.with_changes(value=a.value)
                variants.append((f"arguments {i + 1} and {i + 2}", node.with_changes(args=swapped)))
        self._add("swap", node, variants)

    # boolean

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        ws = {"whitespace_before": node.operator.whitespace_before,
              "whitespace_after": node.operator.whitespace_after}
        if isinstance(node.operator, cst.And):
            # An operand of `and` that becomes `or` needs parentheses to stay one operand
            # (`a and b and c` -> `(a or b) and c`, not `a or b and c`).
            for child in (node.left, node.right):
                if isinstance(child, cst.BooleanOperation) and not child.lpar:
                    self._operands_of_and.add(child)
            new: cst.BaseExpression = node.with_changes(operator=cst.Or(**ws))
            if node in self._operands_of_and:
                new = _parenthesized(new)
            self._add("boolean", node, [("and -> or", new)])
        else:
            # So does an `or` operand of an `or` that becomes `and` (`a or b or c` ->
            # `(a or b) and c`, not `a or b and c`).
            new = node.with_changes(operator=cst.And(**ws), left=_or_operand(node.left),
                                    right=_or_operand(node.right))
            self._add("boolean", node, [("or -> and", new)])

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not):
            inner = node.expression
            if node.lpar and not inner.lpar:
                inner = inner.with_changes(lpar=node.lpar, rpar=node.rpar)
            self._add("boolean", node, [("drop not", inner)])

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("True", "False"):
            flipped = "False" if node.value == "True" else "True"
            self._add("boolean", node, [("literal", node.with_changes(value=flipped))])

    # reduction, dtype

    def _reduction_call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            new = REDUCTION_CALLS.get(func.attr.value)
            if new is not None:
                self._add("reduction", func, [
                    ("call", func.with_changes(attr=func.attr.with_changes(value=new)))])
        elif isinstance(func, cst.Name):
            new = _BUILTIN_REDUCTIONS.get(func.value)
            if new is not None:
                self._add("reduction", func, [("call", func.with_changes(value=new))])

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is None:
            return
        name = node.keyword.value
        if "dtype" in name:  # before reduc*: `reduce_dtype="fp32"` is a dtype
            new = _renamed_string(node.value, DTYPE_STRINGS)
            if new is not None:
                self._add("dtype", node.value, [(f"keyword {name}", new)])
        elif name.startswith("reduc"):
            new = _renamed_string(node.value, REDUCTION_STRINGS)
            if new is not None:
                self._add("reduction", node.value, [(f"keyword {name}", new)])

    def visit_Attribute(self, node: cst.Attribute) -> None:
        attr = node.attr.value
        if _last_name(node.value) == "ReduceOp" and attr in REDUCE_OPS:
            new_attr = node.attr.with_changes(value=REDUCE_OPS[attr])
            self._add("reduction", node, [("ReduceOp", node.with_changes(attr=new_attr))])
            return
        new = DTYPE_ATTRS.get(attr)
        if new is None and isinstance(node.value, cst.Name) and node.value.value == "torch":
            new = _TORCH_DTYPE_ATTRS.get(attr)
        if new is not None:
            self._add("dtype", node, [
                ("attribute", node.with_changes(attr=node.attr.with_changes(value=new)))])


class ReplaceOne(cst.CSTTransformer):
    """Replace (or remove) exactly one node; an emptied block gets ``pass``."""

    def __init__(self, target: cst.CSTNode, replacement: Replacement) -> None:
        """Remember the edit.

        Args:
            target: a node of the tree to transform (matched by identity).
            replacement: its new node, or removal.
        """
        super().__init__()
        self.target, self.replacement = target, replacement

    def on_leave(self, original_node: cst.CSTNode,  # type: ignore[override]
                 updated_node: cst.CSTNode) -> Replacement:
        """Swap in the replacement at the target; refill a block the removal emptied."""
        if original_node is self.target:
            return self.replacement
        if isinstance(updated_node, cst.IndentedBlock) and not updated_node.body:
            return updated_node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated_node


def _one_line(module: cst.Module, node: Replacement) -> str:
    if isinstance(node, cst.RemovalSentinel):
        return "(removed)"
    return " ".join(module.code_for_node(node).split())


def _window(text: str, lo: int, hi: int, width: int) -> str:
    """``text`` cut to about ``width`` characters around its changed part ``text[lo:hi]``."""
    if len(text) <= width:
        return text
    room = width - 6  # two "..."
    if hi - lo <= room:
        ctx = (room - (hi - lo)) // 2
        start = max(0, min(lo - ctx, len(text) - room))
        end = min(len(text), start + room)
        parts = [text[start:end]]
    else:  # the changed part's two ends
        half = (room - 3) // 2
        start, end = lo, hi
        parts = [text[lo:lo + half], "...", text[hi - half:hi]]
    return ("..." if start > 0 else "") + "".join(parts) + ("..." if end < len(text) else "")


def describe(module: cst.Module, old: cst.CSTNode, new: Replacement, width: int = 48) -> str:
    """```old` -> `new``` on one line, each side cut to about ``width`` characters.

    A long side is cut around the part that differs, so the description always shows
    the edit.
    """
    a, b = _one_line(module, old), _one_line(module, new)
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    tail = 0
    while tail < min(len(a), len(b)) - same and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    old_text = _window(a, same, len(a) - tail, width)
    new_text = _window(b, same, len(b) - tail, width)
    return f"`{old_text}` -> `{new_text}`"
