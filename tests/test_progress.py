"""Progress for long commands (issue 15 item 4): fastci.progress and the build-event follower.

Progress in log mode runs on a fake clock; the bar on a stream that says it is a
terminal. The follower reads a file another thread writes in pieces. Then the
commands: ``fastci record`` and ``fastci run`` with a stand-in ``bazel`` that writes its
build events slowly. ``record_tests`` with the real Bazel: tests/test_progress_bazel.py.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
from pathlib import Path

import pytest

from fastci import cli
from fastci.integrations.bazel.bep_follow import BepFollower, follow_bep, follow_bep_progress
from fastci.progress import ENV, Progress, choose_mode
from fake_bazel_support import install_fake_bazel
from selection_support import Repo


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _auto_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)


def _log(total: int | None, clock: FakeClock, **kw: object) -> tuple[Progress, io.StringIO]:
    out = io.StringIO()
    return Progress(total, "record", stream=out, clock=clock, **kw), out  # type: ignore[arg-type]


# --- Progress ------------------------------------------------------------------------------


def test_log_mode_prints_at_the_interval_and_at_the_end_with_tqdms_eta() -> None:
    clock = FakeClock()
    p, out = _log(10, clock, log_every_s=30.0)
    assert p.mode == "log"  # a StringIO is no terminal
    for i in range(10):
        clock.now += 10.0
        p.advance(note=f"//pkg:t{i} PASSED")
        if i == 1:
            assert out.getvalue() == ""  # 20 s: not yet
    p.close()
    p.close()  # idempotent
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # Every 30 s: after tests 3, 6 and 9 (10 s each: the ETA is the 7, 4, 1 left at 10 s).
    assert lines == [
        "fastci: record: 3/10 tests, 00:30 elapsed, ETA 01:10 (last: //pkg:t2 PASSED)",
        "fastci: record: 6/10 tests, 01:00 elapsed, ETA 00:40 (last: //pkg:t5 PASSED)",
        "fastci: record: 9/10 tests, 01:30 elapsed, ETA 00:10 (last: //pkg:t8 PASSED)",
        "fastci: record: 10/10 tests in 01:40",
    ]


def test_log_mode_tick_speaks_while_nothing_finishes() -> None:
    clock = FakeClock()
    p, out = _log(4, clock, log_every_s=30.0)
    clock.now += 5
    p.advance(note="//a:fast PASSED")
    clock.now += 20
    p.tick()
    assert out.getvalue() == ""
    clock.now += 20  # one long test: 45 s without a second one
    p.tick()
    p.tick()  # not due again
    assert out.getvalue().splitlines() == [
        "fastci: record: 1/4 tests, 00:45 elapsed, ETA 02:15 (last: //a:fast PASSED)"]


def test_unknown_total_counts_without_eta_and_set_total_brings_it() -> None:
    clock = FakeClock()
    p, out = _log(None, clock, log_every_s=1.0)
    clock.now += 2
    p.tick()
    clock.now += 2
    p.advance(note="//a:t PASSED")
    clock.now += 2
    p.advance(2)
    p.set_total(6)
    clock.now += 2
    p.tick()
    p.close()
    assert out.getvalue().splitlines() == [
        "fastci: record: 0 tests, 00:02 elapsed",
        "fastci: record: 1 test, 00:04 elapsed (last: //a:t PASSED)",
        "fastci: record: 3 tests, 00:06 elapsed (last: //a:t PASSED)",
        "fastci: record: 3/6 tests, 00:08 elapsed, ETA 00:08 (last: //a:t PASSED)",
        "fastci: record: 3/6 tests in 00:08",
    ]
    # Unknown to the end: a count and the time.
    p, out = _log(None, clock, log_every_s=1e9, unit="rung")
    p.advance(5)
    clock.now += 61
    p.close()
    assert out.getvalue() == "fastci: record: 5 rungs in 01:01\n"


def test_nothing_counted_says_nothing_and_more_than_the_total_drops_it() -> None:
    clock = FakeClock()
    p, out = _log(None, clock)
    p.close()
    assert out.getvalue() == ""
    p, out = _log(1, clock, log_every_s=0.0)
    p.advance()
    p.advance(note="//x:extra PASSED")  # counted short: no "2/1", no ETA
    p.close()
    # Done (n reached the total): no periodic line, the final one says it.
    assert out.getvalue().splitlines() == ["fastci: record: 2 tests in 00:00"]


def test_progress_0_prints_nothing_even_forced(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(ENV, "0")
    clock = FakeClock()
    tty = FakeTTY()
    for stream, interactive in ((tty, None), (tty, True), (io.StringIO(), False)):
        with Progress(3, "run", stream=stream, interactive=interactive, log_every_s=0.0,
                      clock=clock) as p:
            assert p.mode == "off"
            p.advance(note="//a:t")
            p.set_total(4)
            p.tick()
            with p.ticking(0.01):
                time.sleep(0.03)
            p.echo("a line of the command's own")
        assert stream.getvalue() == ""
    assert capsys.readouterr().out == "a line of the command's own\n" * 3


def test_choose_mode() -> None:
    tty, pipe = FakeTTY(), io.StringIO()
    assert choose_mode(tty, environ={}) == "bar"
    assert choose_mode(pipe, environ={}) == "log"
    assert choose_mode(pipe, environ={ENV: "1"}) == "bar"
    assert choose_mode(tty, environ={ENV: "log"}) == "log"
    assert choose_mode(tty, environ={ENV: "0"}) == "off"
    assert choose_mode(pipe, True, environ={ENV: "0"}) == "off"
    assert choose_mode(pipe, True, environ={}) == "bar"
    assert choose_mode(tty, False, environ={ENV: "1"}) == "log"
    assert choose_mode(pipe, environ={ENV: "yes please"}) == "log"  # unknown: auto


def test_a_terminal_gets_a_tqdm_bar_and_echo_does_not_tear_it() -> None:
    tty = FakeTTY()
    with Progress(4, "record", stream=tty) as p:
        assert p.mode == "bar"
        p.advance(note="//a:t PASSED")
        p.echo("fastci run: a line meanwhile", file=tty)
        p.advance()
        p.set_total(5)
        p.tick()
    text = tty.getvalue()
    assert "\r" in text and "fastci record:" in text and "|" in text  # a bar, redrawn in place
    assert re.search(r"\d+/[45] \[\d\d:\d\d<", text), text  # count and elapsed<ETA
    # The echoed line stands alone: the bar was cleared before it and redrawn after it.
    assert "\rfastci run: a line meanwhile\n" in text
    # Closed: the bar is wiped (leave=False) and one final line stays.
    assert text.endswith("\rfastci: record: 2/5 tests in 00:00\n"), repr(text[-200:])


def test_progress_1_forces_the_bar_without_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "1")
    out = io.StringIO()
    with Progress(None, "run", stream=out) as p:
        p.advance(note="//a:t PASSED")
        p.tick()
    assert p.mode == "bar" and "\rfastci run: 0 tests [00:00, ?test/s]" in out.getvalue(), out.getvalue()
    assert out.getvalue().endswith("\rfastci: run: 1 test in 00:00\n")


def test_ticking_ticks_on_a_thread_until_the_block_ends() -> None:
    clock = FakeClock()
    p, out = _log(2, clock, log_every_s=5.0)
    with p.ticking(0.01):
        clock.now += 6
        deadline = time.monotonic() + 5
        while not out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert out.getvalue() == "fastci: record: 0/2 tests, 00:06 elapsed\n"


def test_progress_is_thread_safe() -> None:
    clock = FakeClock()
    p, out = _log(400, clock, log_every_s=0.0)

    def hundred() -> None:
        for _ in range(100):
            p.advance()

    threads = [threading.Thread(target=hundred) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p.close()
    assert p.n == 400 and out.getvalue().splitlines()[-1] == "fastci: record: 400/400 tests in 00:00"


# --- the build-event follower ---------------------------------------------------------------


def _configured(label: str, test: bool = True) -> str:
    payload = {"targetKind": "py_test rule", "testSize": "MEDIUM"} if test else \
        {"targetKind": "py_library rule"}
    return json.dumps({"id": {"targetConfigured": {"label": label}}, "configured": payload})


def _completed(label: str, *, test_summary: bool = True, **payload: object) -> str:
    children = [{"testSummary": {"label": label}}] if test_summary else []
    return json.dumps({"id": {"targetCompleted": {"label": label}}, "children": children,
                       **(payload or {"completed": {"success": True}})})


def _summary(label: str, status: str) -> str:
    return json.dumps({"id": {"testSummary": {"label": label}},
                       "testSummary": {"overallStatus": status}})


def _result(label: str, status: str, attempt: int) -> str:
    return json.dumps({"id": {"testResult": {"label": label, "attempt": attempt}},
                       "testResult": {"status": status}})


def _pattern(*labels: str) -> str:
    return json.dumps({"id": {"pattern": {"pattern": ["//..."]}}, "expanded": {},
                       "children": [{"targetConfigured": {"label": x}} for x in labels]})


EVENTS = [
    json.dumps({"id": {"started": {}}, "started": {"command": "test"}}),
    _pattern("//p:a", "//p:b", "//p:lib", "//p:skipped", "//p:broken", "//p:c"),
    _configured("//p:a"), _configured("//p:b"), _configured("//p:lib", test=False),
    _configured("//p:skipped"), _configured("//p:broken"), _configured("//p:c"),
    _completed("//p:lib", test_summary=False),
    _completed("//p:skipped", test_summary=False,
               aborted={"reason": "SKIPPED", "description": "incompatible"}),
    _completed("//p:a"), _completed("//p:b"),
    _completed("//p:broken", test_summary=False, completed={"success": False}),
    _result("//p:b", "FAILED", 1),  # a flaky test: two attempts, one summary
    _result("//p:b", "PASSED", 2),
    _summary("//p:b", "FLAKY"),
    _completed("//p:c"),
    _result("//p:a", "PASSED", 1),
    _summary("//p:a", "PASSED"),
    # --notest_keep_going stopped it: Bazel 4.2.3 aborts the summary it announced, no reason.
    json.dumps({"id": {"testSummary": {"label": "//p:c"}}, "aborted": {}}),
    _summary("//p:a", "PASSED"),  # said twice: counted once
    json.dumps({"id": {"buildFinished": {}}, "finished": {"exitCode": {"code": 3}}}),
]
FINISHED = [("//p:skipped", "SKIPPED"), ("//p:broken", "FAILED_TO_BUILD"), ("//p:b", "FLAKY"),
            ("//p:a", "PASSED"), ("//p:c", "NO_STATUS")]


def test_follower_sees_each_finished_test_once_in_order_from_a_file_written_in_pieces(
        tmp_path: Path) -> None:
    bep = tmp_path / "bep.json"
    lines = [line + "\n" for line in EVENTS]
    lines.insert(9, "this is {not a build event\n")  # garbage: logged and skipped
    text = "".join(lines)
    cut = text.index('"testSummary": {"overallStatus": "FLAKY"') + 7  # a line split mid-way
    pieces = [text[:len(lines[0]) + 5], text[len(lines[0]) + 5:cut], text[cut:]]
    seen: list[tuple[str, str]] = []
    totals: list[int] = []
    during: list[list[tuple[str, str]]] = []
    written = threading.Event()

    def write() -> None:
        with open(bep, "w") as fh:
            for piece in pieces:
                fh.write(piece)
                fh.flush()
                time.sleep(0.15)
                during.append(list(seen))
        written.set()

    writer = threading.Thread(target=write)
    with follow_bep(bep, lambda label, status: seen.append((label, status)),
                    on_total=totals.append, poll_s=0.02) as follower:
        writer.start()
        written.wait(10)
        writer.join()
    assert seen == FINISHED
    assert totals == [5]  # said once, when every target the pattern named was configured
    assert follower.tests == {"//p:a", "//p:b", "//p:skipped", "//p:broken", "//p:c"}
    assert not follower.failed
    # Followed as it grew: the split line waited for its second half.
    assert during[1] == FINISHED[:2], during


def test_follower_final_drain_reads_a_last_line_without_newline(tmp_path: Path) -> None:
    bep = tmp_path / "bep.json"
    seen: list[tuple[str, str]] = []
    with follow_bep(bep, lambda label, status: seen.append((label, status)), poll_s=10):
        bep.write_text(_configured("//p:a") + "\n" + _completed("//p:a") + "\n"
                       + _summary("//p:a", "FAILED"))  # no newline: Bazel was killed mid-way?
    assert seen == [("//p:a", "FAILED")]


def test_follower_ignores_the_previous_runs_file_until_it_is_rewritten(tmp_path: Path) -> None:
    bep = tmp_path / "bep.json"
    bep.write_text("\n".join([_configured("//old:t"), _completed("//old:t"),
                              _summary("//old:t", "PASSED")]) + "\n")
    seen: list[tuple[str, str]] = []
    follower = BepFollower(bep, lambda label, status: seen.append((label, status)))
    follower.poll()
    assert seen == []
    time.sleep(0.01)
    bep.write_text("\n".join([_configured("//new:t"), _completed("//new:t"),
                              _summary("//new:t", "PASSED")]) + "\n")
    follower.poll()
    assert seen == [("//new:t", "PASSED")]
    # Shrunk (truncated and written again): read from its start.
    bep.write_text(_configured("//x:t") + "\n" + _completed("//x:t") + "\n"
                   + _summary("//x:t", "TIMEOUT") + "\n")
    follower.poll(final=True)
    assert seen == [("//new:t", "PASSED"), ("//x:t", "TIMEOUT")]


def test_follower_never_raises_into_the_caller(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    bep = tmp_path / "bep.json"
    bep.write_text("\n".join([_configured("//p:a"), _completed("//p:a"), _summary("//p:a", "PASSED"),
                              _configured("//p:b"), _completed("//p:b"), _summary("//p:b", "PASSED")])
                   + "\n")
    calls: list[str] = []

    def boom(label: str, status: str) -> None:
        calls.append(label)
        raise RuntimeError("a callback that fails")

    follower = BepFollower(tmp_path / "absent.json", boom)
    follower.path = bep  # not the previous run's file: it appeared after following began
    with caplog.at_level("WARNING"):
        follower.poll()
        follower.poll()
        follower.stop()
    assert calls == ["//p:a"] and follower.failed  # stopped at the first error
    assert "stopped: RuntimeError: a callback that fails" in caplog.text
    # A directory where the file should be: logged, not raised.
    with follow_bep(tmp_path / "dir.json", boom, poll_s=0.01) as f:
        (tmp_path / "dir.json").mkdir()
        time.sleep(0.05)
    assert f.failed


def test_follower_drives_a_progress(tmp_path: Path) -> None:
    bep = tmp_path / "bep.json"
    clock = FakeClock()
    p, out = _log(None, clock, log_every_s=1e9)
    with p, follow_bep_progress(bep, p, poll_s=10):
        bep.write_text("".join(line + "\n" for line in EVENTS))
        clock.now += 75
    assert (p.n, p.total, p.last) == (5, 5, "//p:c NO_STATUS")
    assert out.getvalue() == "fastci: record: 5/5 tests in 01:15\n"


# --- the commands, with a stand-in bazel ------------------------------------------------------

FAKE_BAZEL = """#!{python}
import json, os, sys, time
args = sys.argv[1:]
if args[0] in ("info", "shutdown"):
    print(os.environ.get("FAKE_TESTLOGS", "")); sys.exit(0)
assert args[0] == "test", args
bep = next(a.split("=", 1)[1] for a in args if a.startswith("--build_event_json_file="))
outcomes = json.loads(os.environ["FAKE_OUTCOMES"])
def ev(i, **kw):
    return json.dumps(dict(id=i, **kw)) + "\\n"
with open(bep, "w") as f:
    f.write(ev({{"pattern": {{"pattern": ["//t/..."]}}}}, expanded={{}},
               children=[{{"targetConfigured": {{"label": l}}}} for l in outcomes]))
    for label in outcomes:
        f.write(ev({{"targetConfigured": {{"label": label}}}},
                   configured={{"targetKind": "py_test rule", "testSize": "SMALL"}}))
    for label, status in outcomes.items():
        f.flush()
        time.sleep(0.3)
        f.write(ev({{"testSummary": {{"label": label}}}},
                   testSummary={{"overallStatus": status, "totalRunDurationMillis": "1000"}}))
sys.exit(3 if any(s != "PASSED" for s in outcomes.values()) else 0)
"""


def _fake_bazel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: dict[str, str]) -> Repo:
    return install_fake_bazel(tmp_path, monkeypatch, FAKE_BAZEL, outcomes)


FINAL = re.compile(r"fastci: (record|run): (\d+)/(\d+) tests in \d\d:\d\d$")


def test_record_cli_shows_progress_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _fake_bazel(tmp_path, monkeypatch, {"//t:a": "PASSED", "//t:b": "FAILED", "//t:c": "PASSED"})
    rc = cli.main(["record", "--store", str(tmp_path / "e.db"), "//t/..."])
    out, err = capsys.readouterr()
    assert rc == 1 and out.splitlines()[0] == "2 passed, 1 failed"
    assert "fastci: record:" not in out and "\r" not in err
    finals = [m.groups() for m in map(FINAL.match, err.splitlines()) if m]
    assert finals == [("record", "3", "3")], err


def test_run_cli_progress_goes_to_stderr_and_the_summary_stays_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fake_bazel(tmp_path, monkeypatch, {"//t:a": "PASSED", "//t:b": "PASSED"})
    rc = cli.main(["run", "--no-record"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.splitlines()[-1] == "2 passed, 0 failed", out
    assert "fastci: run:" not in out
    assert err.splitlines()[-1:] and FINAL.match(err.splitlines()[-1]), err
    assert FINAL.match(err.splitlines()[-1]).groups() == ("run", "2", "2")  # type: ignore[union-attr]
    # Off: nothing on stderr at all.
    monkeypatch.setenv(ENV, "0")
    rc = cli.main(["run", "--no-record"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.splitlines()[-1] == "2 passed, 0 failed" and err == ""
