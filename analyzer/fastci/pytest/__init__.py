"""The pytest front end, beside the CLI: ``plugin`` (entry point ``pytest11: fastci``,
``-p fastci.pytest_plugin``) records evidence per test with ``--fastci-record`` and
obeys a plan with ``--fastci-plan``, whose deselection, ordering and overrides live
in ``plan``; ``ids`` names an item as FastCI does, and ``untraced`` keeps assertion
rewriting out of a recording. It uses the recorder and the plan model, and no stage
uses it (a stage that runs pytest names the plugin on its command line).

pytest rewrites the ``assert`` statements of every module of a distribution that
declares a ``pytest11`` entry point, so installing FastCI made every ``fastci``
module a pytest process imports go through assertion rewriting (read, parse,
rewrite in Python, compile: about 8 ms a module when no ``.pyc`` cache can be
written, as in a fresh CI checkout or under ``PYTHONDONTWRITEBYTECODE=1``). Nothing
gains from rewritten asserts in FastCI's own code, so importing this package takes
``fastci`` off pytest's list (:func:`_not_rewritten`); the modules imported before
it (``fastci`` itself) is small.
"""

from __future__ import annotations

import sys


def _not_rewritten() -> None:
    """Take ``fastci`` (and its submodules) off the names pytest's import hook rewrites.

    The hook's list is private pytest state, so this is done only where it has the
    shape it has had since pytest 3; anything else leaves it alone.
    """
    for finder in sys.meta_path:
        if type(finder).__name__ != "AssertionRewritingHook":
            continue
        marked = getattr(finder, "_must_rewrite", None)
        if isinstance(marked, set):
            marked.difference_update(
                [name for name in marked if name == "fastci" or name.startswith("fastci.")])


_not_rewritten()
