"""Unit tests of the pure parts of fastci.integrations.bazel (BEP folding, query XML, testlogs paths).

The real-Bazel side of each is exercised in tests/test_bazel_rules.py.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from fastci.integrations.bazel import testlogs
from fastci.integrations.bazel.bep import parse_bep, parse_bep_lines
from fastci.integrations.bazel.query import parse_query_xml
from fastci.integrations.bazel.runner import Bazel, plan_digest
from fastci.errors import BazelError
from fastci.types import LabelError


def _result(label: str, status: str, ms: int, cached: bool = False, attempt: int = 1) -> str:
    return json.dumps(
        {
            "id": {"testResult": {"label": label, "run": 1, "shard": 1, "attempt": attempt}},
            "testResult": {"status": status, "testAttemptDurationMillis": str(ms), "cachedLocally": cached},
        }
    )


def _summary(label: str, status: str, ms: int) -> str:
    return json.dumps(
        {"id": {"testSummary": {"label": label}}, "testSummary": {"overallStatus": status, "totalRunDurationMillis": str(ms)}}
    )


def test_bep_folds_attempts_and_summaries() -> None:
    lines = [
        json.dumps({"id": {"started": {}}, "started": {"command": "test"}}),
        _result("//p:a", "FAILED", 1000, attempt=1),
        _result("//p:a", "PASSED", 1200, attempt=2),
        _summary("//p:a", "FLAKY", 2200),
        _result("//p:b", "PASSED", 10, cached=True),
        _summary("//p:b", "PASSED", 10),
        _result("//p:c", "TIMEOUT", 5000),
        json.dumps({"id": {"targetCompleted": {"label": "//p:d"}}, "aborted": {"reason": "SKIPPED"}}),
        json.dumps({"id": {"buildFinished": {}}, "finished": {"exitCode": {"name": "TESTS_FAILED", "code": 3}}}),
        '{"id": {"progress"',  # bazel killed mid-write
    ]
    report = parse_bep_lines(lines)
    a, b, c = (report.outcomes[x] for x in ("//p:a", "//p:b", "//p:c"))
    assert (a.status, a.duration_s, a.attempts, a.cached, a.passed) == ("FLAKY", 2.2, 2, False, True)
    assert (b.status, b.cached) == ("PASSED", True)
    assert (c.status, c.duration_s, c.passed) == ("TIMEOUT", 5.0, False)
    assert (report.exit_code, report.exit_name) == (3, "TESTS_FAILED")
    assert report.skipped == ("//p:d",) and "//p:d" not in report.outcomes
    assert report.summary_line() == "2 passed, 1 failed"


def test_bep_labels_are_canonical_test_ids() -> None:
    # Outcomes are looked up by normalize_test_id(plan id): a label in another
    # spelling must land on the same key, never on a second one.
    lines = [
        _result("@//p:a", "PASSED", 10),
        _summary("//p:a", "PASSED", 10),
        _result("//p/q", "FAILED", 10),
        json.dumps({"id": {"targetCompleted": {"label": "@//p:d"}}, "aborted": {"reason": "SKIPPED"}}),
    ]
    report = parse_bep_lines(lines)
    assert sorted(report.outcomes) == ["//p/q:q", "//p:a"]
    assert report.outcomes["//p:a"].attempts == 1 and not report.outcomes["//p/q:q"].passed
    assert report.skipped == ("//p:d",)


def test_bep_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bep.json"
    path.write_text("not json\n" + _summary("//p:a", "PASSED", 1) + "\n")
    with pytest.raises(BazelError, match="bep.json:1: not a JSON build event"):
        parse_bep(path)
    with pytest.raises(BazelError, match="cannot read build events"):
        parse_bep(tmp_path / "missing.json")


_XML = """<?xml version="1.1" encoding="UTF-8" standalone="no"?>
<query version="2">
  <rule class="fastci_meta" location="/w/p/BUILD.bazel:3:9" name="//p:a_test__fastci_meta">
    <label name="test" value="//p:a_test"/>
    <int name="gpus" value="2"/>
    <dict name="workload">
      <pair><string value="dtype"/><string value="&quot;bf16&quot;"/></pair>
      <pair><string value="steps"/><string value="100"/></pair>
    </dict>
    <dict name="floors"><pair><string value="steps"/><string value="2"/></pair></dict>
    <list name="scope"><string value="parallel_parity"/></list>
    <list name="constraints"/>
    <list name="srcs"><label value="//p:a_test.py"/></list>
    <string name="main" value="a_test.py"/>
  </rule>
  <rule class="py_test" name="//p:other"/>
</query>"""


def test_query_xml_decodes_json_values() -> None:
    (decl,) = parse_query_xml(_XML)
    assert decl.id == "//p:a_test" and decl.gpus == 2
    assert decl.workload == {"dtype": "bf16", "steps": 100} and decl.floors == {"steps": 2}
    assert (decl.scope, decl.constraints, decl.srcs, decl.main) == (("parallel_parity",), (), ("//p:a_test.py",), "a_test.py")
    with pytest.raises(BazelError, match="malformed XML"):
        parse_query_xml("<query")
    (short,) = parse_query_xml(_XML.replace('value="//p:a_test"', 'value="@//p/a_test"'))
    assert short.id == "//p/a_test:a_test"  # one spelling per test, whatever Bazel printed


def test_testlogs_reads_plain_and_zipped_outputs(tmp_path: Path) -> None:
    assert testlogs.test_dir(tmp_path, "//p/q:t") == tmp_path / "p/q/t"
    assert testlogs.test_dir(tmp_path, "@r//p:t") == tmp_path / "external/r/p/t"
    assert testlogs.test_dir(tmp_path, "@//p/q") == tmp_path / "p/q/q"
    assert testlogs.test_dir(tmp_path, "//:t") == tmp_path / "t"
    assert testlogs.test_dir(tmp_path, "@r") == tmp_path / "external/r/r"
    with pytest.raises(LabelError, match="target name after ':' is empty"):
        testlogs.test_dir(tmp_path, "//p:")
    outputs = tmp_path / "p" / "t" / "test.outputs"
    outputs.mkdir(parents=True)
    with zipfile.ZipFile(outputs / "outputs.zip", "w") as zf:
        zf.writestr("fastci_workload.json", "{}")
        zf.writestr("fastci_traces/rank0.pb", "x")
    (outputs / "plain.txt").write_text("p")
    assert testlogs.read_output(tmp_path, "//p:t", "fastci_workload.json") == b"{}"
    assert testlogs.read_output(tmp_path, "//p:t", "plain.txt") == b"p"
    assert testlogs.read_output(tmp_path, "//p:t", "nope") is None


def test_runner_adds_plan_and_venv_digests(tmp_path: Path) -> None:
    bazel = Bazel(tmp_path, startup=["--output_base=/x"])
    assert plan_digest(tmp_path) == "absent"
    query = bazel.argv("query", ["//..."])
    assert query == ["bazel", "--output_base=/x", "query", "--repo_env=FASTCI_PLAN_DIGEST=absent",
                     "--repo_env=FASTCI_TREE_DIGEST=unknown", "//..."]
    (tmp_path / ".fastci").mkdir()
    (tmp_path / ".fastci" / "plan.json").write_text("{}")
    test = bazel.argv("test", ["//..."])
    assert test[3] == f"--repo_env=FASTCI_PLAN_DIGEST={plan_digest(tmp_path)}" != "absent"
    assert test[4] == "--repo_env=FASTCI_TREE_DIGEST=unknown"  # tmp_path is no git repository
    assert test[5].startswith("--test_env=FASTCI_VENV_DIGEST=") and test[5] != "--test_env=FASTCI_VENV_DIGEST=unknown"
    assert bazel.argv("shutdown", []) == ["bazel", "--output_base=/x", "shutdown"]


def test_a_remote_cache_hit_counts_as_cached() -> None:
    """Bazel 4.2.3 marks a result served by a remote cache (issue 16) in executionInfo."""
    remote = json.dumps({
        "id": {"testResult": {"label": "//p:r", "run": 1, "shard": 1, "attempt": 1}},
        "testResult": {"status": "PASSED", "testAttemptDurationMillis": "700",
                       "executionInfo": {"cachedRemotely": True, "strategy": "remote"}}})
    fresh = _result("//p:f", "PASSED", 700)
    report = parse_bep_lines([remote, _summary("//p:r", "PASSED", 700), fresh,
                              _summary("//p:f", "PASSED", 700)])
    assert report.outcomes["//p:r"].cached and not report.outcomes["//p:f"].cached


def test_the_report_carries_aborted_tests_and_the_first_failure() -> None:
    """One parse gives what --fail-fast reports: aborted tests, and when the first
    uncached failure ended relative to the command's start."""
    def timed(label: str, status: str, start_ms: int, ms: int, cached: bool = False) -> str:
        return json.dumps({
            "id": {"testResult": {"label": label, "run": 1, "shard": 1, "attempt": 1}},
            "testResult": {"status": status, "testAttemptDurationMillis": str(ms),
                           "testAttemptStartMillisEpoch": str(start_ms), "cachedLocally": cached}})
    lines = [json.dumps({"id": {"started": {}}, "started": {"startTimeMillis": "100000"}}),
             timed("//p:old", "FAILED", 100000, 500, cached=True),
             timed("//p:late", "FAILED", 101000, 9000),
             timed("//p:bad", "FAILED", 102000, 1000),
             json.dumps({"id": {"testResult": {"label": "//p:cut", "run": 1, "shard": 1,
                                               "attempt": 1}}, "aborted": {}}),
             json.dumps({"id": {"testSummary": {"label": "//p:cut"}}, "aborted": {}})]
    report = parse_bep_lines(lines)
    assert report.aborted == ("//p:cut",)
    assert report.first_failure() == ("//p:bad", 3.0)
    assert report.first_failure(start=101.0) == ("//p:bad", 2.0)
