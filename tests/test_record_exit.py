"""``fastci record`` exits non-zero when a test fails while recording (issue 11 item 2).

A stand-in ``bazel`` (``$FASTCI_BAZEL``) answers ``bazel test`` with a build event
file in which some tests fail, and ``bazel info bazel-testlogs`` with an empty folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fastci import cli
from fake_bazel_support import install_fake_bazel

FAKE_BAZEL = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args[0] == "info":
    print(os.environ["FAKE_TESTLOGS"]); sys.exit(0)
if args[0] == "shutdown":
    sys.exit(0)
assert args[0] == "test" and "--config=fastci_record" in args, args
bep = next(a.split("=", 1)[1] for a in args if a.startswith("--build_event_json_file="))
outcomes = json.loads(os.environ["FAKE_OUTCOMES"])
with open(bep, "w") as f:
    for label, status in outcomes.items():
        f.write(json.dumps({{"id": {{"testSummary": {{"label": label}}}},
                            "testSummary": {{"overallStatus": status,
                                             "totalRunDurationMillis": "1000"}}}}) + "\\n")
sys.exit(3 if any(s != "PASSED" for s in outcomes.values()) else 0)
"""


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: dict[str, str],
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    install_fake_bazel(tmp_path, monkeypatch, FAKE_BAZEL, outcomes)
    rc = cli.main(["record", "--store", str(tmp_path / "e.db"), "//t:all"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_record_with_a_failing_test_exits_non_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _record(tmp_path, monkeypatch,
                           {"//t:a": "PASSED", "//t:b": "FAILED", "//t:c": "PASSED"}, capsys)
    assert rc == 1
    assert out.splitlines()[0] == "2 passed, 1 failed"
    assert "fastci record: 1 test(s) failed while recording: //t:b" in err
    # The summary still reports the ingest (the evidence of the passing tests is kept).
    assert out.splitlines()[1].startswith("ingested ")


def test_record_with_every_test_passing_exits_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _record(tmp_path, monkeypatch, {"//t:a": "PASSED"}, capsys)
    assert rc == 0 and out.splitlines()[0] == "1 passed, 0 failed"
    assert "failed while recording" not in err
