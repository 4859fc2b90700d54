"""The constraint language of gpu_test, evaluated in Starlark (twin of `fastci.plan.workload`).

A constraint such as `num_layers % pp == 0` relates workload dimensions.
`check_constraint(expr, workload)` returns `struct(ok, error)`: `ok` is the
bool result when `error` is None. The language (a safe subset of Python
expressions) and the algorithm are those of `analyzer/fastci/plan/workload.py`:
a tokenizer, a shunting-yard pass to reverse Polish notation, and a value
stack; Starlark has no recursion or `while`, so every loop is a bounded `for`.
`//rules/tests:constraints_test` and `tests/test_workload.py` run the same
corpus (`rules/tests/constraint_cases.json`) so the two never drift.
"""

_COMPARISONS = ["==", "!=", "<", "<=", ">", ">="]
_ARITHMETIC = ["+", "-", "*", "/", "//", "%"]
_BINARY_PREC = {
    "or": 1,
    "and": 2,
    "==": 4,
    "!=": 4,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "//": 6,
    "%": 6,
}
_UNARY_PREC = {"not": 3, "-": 7, "+": 7}
_FUNCTIONS = {"min": (2, 64), "max": (2, 64), "abs": (1, 1)}
_KEYWORDS = ["and", "or", "not"]
_UNSUPPORTED_WORDS = ["None", "in", "is", "if", "else", "lambda", "for", "true", "false", "null"]
_TWO_CHAR_OPS = ["//", "==", "!=", "<=", ">=", "**"]
_ONE_CHAR_OPS = "+-*/%<>(),"
_DIGITS = "0123456789"
_IDENT_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_IDENT_REST = _IDENT_START + _DIGITS

def _err(msg):
    return struct(err = msg)

def _is_err(v):
    return type(v) == "struct"

def _is_number(v):
    return type(v) in ("int", "float")

def _run_end(expr, i, chars):
    """Index of the first character at or after `i` that is not in `chars`."""
    for j in range(i, len(expr)):
        if expr[j] not in chars:
            return j
    return len(expr)

def _scan_number(expr, i):
    """Returns (token, next index, error)."""
    n = len(expr)
    j = _run_end(expr, i, _DIGITS)
    is_float = False
    if j < n and expr[j] == ".":
        is_float = True
        j = _run_end(expr, j + 1, _DIGITS)
    if j < n and expr[j] in "eE":
        k = j + 1
        if k < n and expr[k] in "+-":
            k += 1
        if k >= n or expr[k] not in _DIGITS:
            return None, j, "malformed number at column %d" % (i + 1)
        is_float = True
        j = _run_end(expr, k, _DIGITS)
    if j < n and expr[j] in _IDENT_REST + ".":
        return None, j, "malformed number at column %d" % (i + 1)
    text = expr[i:j]
    if is_float:
        return ("num", float(text)), j, None
    if len(text) > 1 and text[0] == "0":
        return None, j, "number %s has a leading zero (column %d)" % (text, i + 1)
    return ("num", int(text)), j, None

def tokenize(expr):
    """Splits `expr` into (kind, value) tokens; returns (tokens, error)."""
    tokens = []
    skip_to = 0
    for i in range(len(expr)):
        if i < skip_to:
            continue
        c = expr[i]
        if c in " \t\r\n":
            continue
        if c in _DIGITS or (c == "." and i + 1 < len(expr) and expr[i + 1] in _DIGITS):
            token, skip_to, error = _scan_number(expr, i)
            if error:
                return None, error
            tokens.append(token)
        elif c in _IDENT_START:
            skip_to = _run_end(expr, i, _IDENT_REST)
            word = expr[i:skip_to]
            if word in ("True", "False"):
                tokens.append(("bool", word == "True"))
            elif word in _KEYWORDS:
                tokens.append(("op", word))
            elif word in _UNSUPPORTED_WORDS:
                return None, "unsupported word %r (column %d)" % (word, i + 1)
            else:
                tokens.append(("name", word))
        elif c in "'\"":
            end = expr.find(c, i + 1)
            if end < 0:
                return None, "unclosed string starting at column %d" % (i + 1)
            text = expr[i + 1:end]
            if "\\" in text:
                return None, "escape sequences are not supported in strings (column %d)" % (i + 1)
            tokens.append(("str", text))
            skip_to = end + 1
        elif expr[i:i + 2] in _TWO_CHAR_OPS:
            if expr[i:i + 2] == "**":
                return None, "unsupported operator ** (column %d)" % (i + 1)
            tokens.append(("op", expr[i:i + 2]))
            skip_to = i + 2
        elif c in _ONE_CHAR_OPS:
            tokens.append(("op", c))
        else:
            return None, "unexpected character %r (column %d)" % (c, i + 1)
    return tokens, None

def _pop_until_paren(ops, out):
    for _ in range(len(ops)):
        if ops[-1][0] in ("(", "call("):
            return
        kind, op, _prec = ops.pop()
        out.append((kind, op, 0))

def _compiled(program = None, names = None, error = None):
    return struct(program = program, names = names, error = error)

def parse_constraint(expr):
    """Compiles `expr` to RPN: returns struct(program, names, error)."""
    if type(expr) != "string":
        return _compiled(error = "a constraint must be a string, got %s" % type(expr))
    tokens, error = tokenize(expr)
    if error:
        return _compiled(error = error)
    out = []
    ops = []  # (kind, op, precedence); kind: unary, binary, "(" or "call("
    argc = []
    names = []
    expect_operand = True
    call_paren = False
    for k in range(len(tokens)):
        kind, value = tokens[k]
        nxt = tokens[k + 1] if k + 1 < len(tokens) else ("end", "")
        if kind in ("num", "str", "bool", "name"):
            if not expect_operand:
                return _compiled(error = "expected an operator before %r" % (value,))
            if kind == "name" and nxt == ("op", "("):
                if value not in _FUNCTIONS:
                    return _compiled(error = "unknown function %s() (allowed: abs, max, min)" % value)
                ops.append(("call(", value, 0))
                argc.append(1)
                call_paren = True
                continue
            if kind == "name":
                out.append(("name", value, 0))
                if value not in names:
                    names.append(value)
            else:
                out.append(("const", value, 0))
            expect_operand = False
        elif value == "(":
            if call_paren:
                call_paren = False
                continue
            if not expect_operand:
                return _compiled(error = "unexpected '(' after a value (only abs, max and min can be called)")
            ops.append(("(", "(", 0))
        elif value == ")":
            if expect_operand:
                return _compiled(error = "unexpected ')'")
            _pop_until_paren(ops, out)
            if not ops:
                return _compiled(error = "unbalanced ')'")
            open_kind, fname, _prec = ops.pop()
            if open_kind == "call(":
                n = argc.pop()
                low, high = _FUNCTIONS[fname]
                if n < low or n > high:
                    return _compiled(error = "%s() takes %d%s arguments, got %d" % (fname, low, "" if low == high else " or more", n))
                out.append(("call", fname, n))
        elif value == ",":
            if expect_operand:
                return _compiled(error = "unexpected ','")
            _pop_until_paren(ops, out)
            if not ops or ops[-1][0] != "call(":
                return _compiled(error = "',' outside a function call")
            argc[-1] += 1
            expect_operand = True
        elif expect_operand:
            if value not in _UNARY_PREC:
                return _compiled(error = "expected a value, got %r" % (value,))
            ops.append(("unary", value, _UNARY_PREC[value]))
        else:
            if value not in _BINARY_PREC:
                return _compiled(error = "unexpected %r after a value" % (value,))
            prec = _BINARY_PREC[value]
            for _ in range(len(ops)):
                if ops[-1][0] not in ("unary", "binary") or ops[-1][2] < prec:
                    break
                if prec == 4 and ops[-1][2] == 4:
                    return _compiled(error = "chained comparison: write 'a < b and b < c'")
                top_kind, op, _prec = ops.pop()
                out.append((top_kind, op, 0))
            ops.append(("binary", value, prec))
            expect_operand = True
    if expect_operand:
        return _compiled(error = "unexpected end of expression" if tokens else "empty expression")
    for _ in range(len(ops)):
        kind, op, _prec = ops.pop()
        if kind in ("(", "call("):
            return _compiled(error = "unclosed '('")
        out.append((kind, op, 0))
    return _compiled(program = out, names = names)

def _arith(op, a, b):
    if not _is_number(a) or not _is_number(b):
        return _err("unsupported operand types for %s: %s and %s" % (op, type(a), type(b)))
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return _err("division by zero in %s" % op)
    if op == "/":
        return float(a) / float(b)
    if op == "//":
        return a // b
    return a % b

def _compare(op, a, b):
    same = (_is_number(a) and _is_number(b)) or (type(a) == "string" and type(b) == "string")
    if op in ("==", "!="):
        if not same and not (type(a) == "bool" and type(b) == "bool"):
            return _err("cannot compare %s and %s with %s" % (type(a), type(b), op))
        return (a == b) == (op == "==")
    if not same:
        return _err("cannot order %s and %s with %s" % (type(a), type(b), op))
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a >= b

def _binary(op, a, b):
    if op in ("and", "or"):
        if _is_err(a):
            return a
        if type(a) != "bool":
            return _err("%s needs booleans, got %s" % (op, type(a)))
        if a == (op == "or"):
            return a  # decided by the left operand: the right one is not evaluated
        if _is_err(b):
            return b
        if type(b) != "bool":
            return _err("%s needs booleans, got %s" % (op, type(b)))
        return b
    if _is_err(a):
        return a
    if _is_err(b):
        return b
    if op in _ARITHMETIC:
        return _arith(op, a, b)
    return _compare(op, a, b)

def _unary(op, a):
    if _is_err(a):
        return a
    if op == "not":
        return (not a) if type(a) == "bool" else _err("not needs a boolean, got %s" % type(a))
    if not _is_number(a):
        return _err("unary %s needs a number, got %s" % (op, type(a)))
    return -a if op == "-" else a

def _call(name, args):
    for arg in args:
        if _is_err(arg):
            return arg
        if not _is_number(arg):
            return _err("%s() needs numbers, got %s" % (name, type(arg)))
    if name == "abs":
        return -args[0] if args[0] < 0 else args[0]
    best = args[0]
    for n in args[1:]:
        if (n < best) if name == "min" else (n > best):
            best = n
    return best

def run_program(compiled, workload):
    """Evaluates a compiled constraint: returns struct(ok, error)."""
    for name in compiled.names:
        if name not in workload:
            known = ", ".join(sorted(workload.keys())) or "none"
            return struct(ok = False, error = "unknown name %r (workload dimensions: %s)" % (name, known))
    stack = []
    for kind, payload, n in compiled.program:
        if kind == "const":
            stack.append(payload)
        elif kind == "name":
            stack.append(workload[payload])
        elif kind == "unary":
            stack.append(_unary(payload, stack.pop()))
        elif kind == "binary":
            b = stack.pop()
            a = stack.pop()
            stack.append(_binary(payload, a, b))
        else:
            args = stack[len(stack) - n:]
            stack = stack[:len(stack) - n]
            stack.append(_call(payload, args))
    result = stack[0]
    if _is_err(result):
        return struct(ok = False, error = result.err)
    if type(result) != "bool":
        return struct(ok = False, error = "evaluates to %s, not a bool" % type(result))
    return struct(ok = result, error = None)

def check_constraint(expr, workload):
    """Parses and evaluates one constraint: returns struct(ok, error)."""
    compiled = parse_constraint(expr)
    if compiled.error:
        return struct(ok = False, error = compiled.error)
    return run_program(compiled, workload)

def render(value):
    """Renders a workload value in a message as fastci.plan.workload does (strings JSON-quoted: one line)."""
    if type(value) == "string":
        return json.encode(value)
    return str(value)

def constraint_problems(constraints, workload):
    """One line per constraint that fails or cannot be evaluated on `workload`."""
    problems = []
    for text in constraints:
        res = check_constraint(text, workload)
        if res.error:
            problems.append('constraint "%s" cannot be evaluated: %s' % (text, res.error))
        elif not res.ok:
            problems.append('constraint "%s" does not hold' % text)
    return problems
