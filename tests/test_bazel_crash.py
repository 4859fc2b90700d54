"""A Bazel server that crashes is named with its own words, not "no output".

Reported: ``fastci run`` with ``--remote_cache=htp://...`` (a typo) crashed Bazel's
server, and FastCI said only ``bazel test failed (exit 37): no output``: the client
prints nothing about a server crash; the server's log (``<output_base>/java.log``) says.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fastci.errors import BazelError
from bazel_support import require_bazel
from fastci.integrations.bazel.runner import Bazel, server_crash

require_bazel()  # skips without bazel; fails under CI

LOG_TAIL = (
    '261207 18:11:27.327:I 20 [com.google.devtools.build.lib.runtime.BlazeRuntime'
    '.shutDownModulesOnCrash] Shutting down MetricsModule on crash\n'
    '261207 18:11:27.333:I 20 [com.google.devtools.build.lib.runtime.BlazeCommandDispatcher'
    '.exec] Exit status was DetailedExitCode{exitCode=BLAZE_INTERNAL_ERROR, failureDetail='
    'message: "Crashed: (java.io.IOException) Failed to init TLS infrastructure"\n'
    'crash {\n')


def test_the_crash_message_is_read_from_the_servers_log(tmp_path: Path) -> None:
    (tmp_path / "java.log.vm.root.log.java.20261207-181122.1").write_text("noise\n" * 1000 + LOG_TAIL)
    (tmp_path / "java.log.vm.root.log.java.20261207-181130.2").write_text("a new server\n")
    assert server_crash(tmp_path) == ("Crashed: (java.io.IOException) Failed to init TLS "
                                      "infrastructure (BLAZE_INTERNAL_ERROR)")
    assert server_crash(tmp_path, since=time.time() + 60) is None  # none written since
    assert server_crash(tmp_path / "absent") is None


def test_a_bad_remote_cache_url_is_reported_with_bazels_own_words(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "WORKSPACE").write_text("")
    (ws / "BUILD").write_text('sh_test(name = "t", srcs = ["t.sh"])\n')
    (ws / "t.sh").write_text("#!/bin/sh\nexit 0\n")
    (ws / "t.sh").chmod(0o755)
    bazel = Bazel(ws)
    try:
        with pytest.raises(BazelError) as err:
            bazel.test(["//:t"], flags=["--remote_cache=htp://127.0.0.1:1"], timeout=300)
        message = str(err.value)
        assert "no output" not in message and "crashed" in message.lower(), message
        assert "\n" not in message
    finally:
        bazel.shutdown()
