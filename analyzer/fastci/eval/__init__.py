"""``fastci eval``: measure FastCI's plans against running everything, on real runs.

The stages, one module each:

- :mod:`.changes` — what to evaluate: commits, ranges, patch files, and generated
  faults (:mod:`.faults`) on top of them;
- :mod:`.workspace` — a scratch git worktree where each change is checked out, so
  the user's checkout, plan and evidence store are never touched;
- :mod:`.execute` — running tests for real through Bazel or pytest, recorded in line
  mode, one :class:`~fastci.eval.execute.TestRun` per test;
- :mod:`.metrics` — pure: cost, list-scheduled latency on G GPU slots, retention,
  detection, time to first failure, APFDc;
- :mod:`.harness` — the loop: baseline (cached per tree), plan, plan's runs, metrics;
- :mod:`.results` — the ``results.jsonl`` schema; :mod:`.report` — ``summary.md`` and
  ``report.html``.
"""
