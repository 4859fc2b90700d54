"""The recorder's audit hook: the C hook (fastci/evidence/record/native_audit.c) and the Python
fallback deliver the same events, and the C hook keeps the others out of Python.

Audit hooks cannot be removed, so every case runs in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Sinks on every kind of event; each file and program is touched once, then the sinks go.
_PROBE = textwrap.dedent("""
    import json, os, sys
    from fastci.evidence.record import files

    got = []
    files.set_open_sink(lambda name: got.append(["read", os.path.basename(name)]))
    files._AUDITOR.write_sink = lambda name: got.append(["wrote", os.path.basename(name)])
    files._AUDITOR.changed()
    files.set_exec_sink(lambda code: got.append(["exec", code.co_filename]))
    files.set_event_sink(lambda event, args: got.append([event, os.path.basename(args[0])]),
                         frozenset({"os.listdir"}))
    work = sys.argv[1]
    with open(os.path.join(work, "in.txt")) as f:
        f.read()
    with open(os.path.join(work, "out.txt"), "w") as f:
        f.write("x")
    exec(compile("1", "<probe>", "exec"))
    os.listdir(work)
    id(got)  # an event no sink wants
    files.set_open_sink(None)
    files._AUDITOR.write_sink = None
    files.set_exec_sink(None)
    files.set_event_sink(None)
    with open(os.path.join(work, "in.txt")) as f:  # no sink: not seen
        f.read()
    print(json.dumps({"kind": files._AUDITOR.kind, "got": got}))
""")


def _probe(tmp_path: Path, hook: str) -> dict[str, object]:
    (tmp_path / "in.txt").write_text("hello")
    env = dict(os.environ, FASTCI_AUDIT_HOOK=hook)
    out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], env=env, check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_the_c_hook_is_built_by_setup() -> None:
    """``make setup`` builds it (an optional extension: a failed build would only be a
    warning in pip's output, and every recording would quietly take the slow hook)."""
    from fastci.evidence.record import native_audit  # type: ignore[attr-defined]

    assert callable(native_audit.install) and callable(native_audit.set_events)


def test_both_hooks_deliver_the_same_events(tmp_path: Path) -> None:
    c, py = _probe(tmp_path, "auto"), _probe(tmp_path, "python")
    assert (c["kind"], py["kind"]) == ("c", "python")
    want = [["read", "in.txt"], ["wrote", "out.txt"], ["exec", "<probe>"],
            ["os.listdir", tmp_path.name]]
    assert c["got"] == want
    assert py["got"] == want


_UNWANTED = textwrap.dedent("""
    import json, os
    from fastci.evidence.record import files

    calls = []
    files._AUDITOR.on_other = lambda event, args: calls.append(event)
    files.set_event_sink(lambda event, args: None, frozenset({"os.listdir"}))
    for _ in range(100):
        id(calls)
        os.getcwd()
    os.listdir(".")
    print(json.dumps(calls))
""")


def test_the_c_hook_lets_through_only_what_is_asked_for() -> None:
    out = subprocess.run([sys.executable, "-c", _UNWANTED], check=True, capture_output=True,
                         text=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == ["os.listdir"]


@pytest.mark.parametrize("names, error", [
    (["x" * 64], "under 64 bytes"),
    ([""], "under 64 bytes"),
    ([3], "under 64 bytes"),
    (["e"] * 33, "at most 32"),
    (5, "sequence"),
])
def test_bad_event_names_are_refused_and_keep_the_table(names: object, error: str) -> None:
    code = textwrap.dedent(f"""
        import json, os
        from fastci.evidence.record import native_audit
        seen = []
        native_audit.install(lambda event, args: seen.append(event), ["os.listdir"])
        try:
            native_audit.set_events({names!r})
        except (ValueError, TypeError) as exc:
            print(str(exc))
        os.listdir(".")
        print(json.dumps(seen))
    """)
    lines = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                           text=True).stdout.strip().splitlines()
    assert error in lines[0]
    assert json.loads(lines[-1]) == ["os.listdir"]


def test_a_second_install_is_refused() -> None:
    code = textwrap.dedent("""
        from fastci.evidence.record import native_audit
        native_audit.install(print, [])
        try:
            native_audit.install(print, [])
        except RuntimeError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert "installed already" in out
