"""A tiny Starlark unit-test harness (no skylib offline).

Test cases are plain functions returning a list of failure strings; they run
while the BUILD file loads, and `starlark_unit_test` turns the result into a
test target that passes, or prints every failure and fails.
"""

def assert_eq(failures, what, actual, expected):
    """Appends a failure to `failures` when `actual != expected`."""
    if actual != expected:
        failures.append("%s: expected %r, got %r" % (what, expected, actual))

def assert_contains(failures, what, text, part):
    """Appends a failure when `part` is not in `text`."""
    if type(text) != "string" or part not in text:
        failures.append("%s: expected text containing %r, got %r" % (what, part, text))

def _impl(ctx):
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    lines = ["#!/bin/sh"]
    for f in ctx.attr.failures:
        lines.append("echo %s" % shell_quote("FAIL: " + f))
    lines.append("echo %s" % shell_quote("%d case(s), %d failure(s)" % (ctx.attr.cases, len(ctx.attr.failures))))
    lines.append("exit %d" % (1 if ctx.attr.failures else 0))
    ctx.actions.write(script, "\n".join(lines) + "\n", is_executable = True)
    return [DefaultInfo(executable = script)]

def shell_quote(s):
    """Quotes `s` for /bin/sh."""
    return "'" + s.replace("'", "'\\''") + "'"

_starlark_unit_test = rule(
    implementation = _impl,
    test = True,
    doc = "Reports failures collected while loading (see starlark_unit_test).",
    attrs = {
        "failures": attr.string_list(doc = "Failure messages; empty = pass."),
        "cases": attr.int(doc = "Number of test functions run."),
    },
)

def starlark_unit_test(name, cases, **kwargs):
    """Runs each function in `cases` (returning failure strings) and declares a test.

    Args:
      name: test name.
      cases: list of zero-argument functions returning lists of failures.
      **kwargs: passed to the test rule (tags, size...).
    """
    failures = []
    for case in cases:
        for f in case():
            failures.append("%s: %s" % (str(case).replace("<function ", "").rstrip(">"), f))
    _starlark_unit_test(name = name, failures = failures, cases = len(cases), **kwargs)
