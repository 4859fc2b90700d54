"""Where the two kinds of test id meet: a gpu_test's label and its main file's pytest node ids.

A ``gpu_test`` runs one main file; when that file is a pytest module, each of
its pytest items *is* (part of) that gpu_test. So ``//pkg:foo_test`` and
``pkg/foo_test.py::test_x`` name the same test, whichever kind the evidence was
recorded under or the plan was written in.

Two sources of the mapping, both pure:

* exact: the declarations from ``bazel query`` (:class:`~fastci.integrations.bazel.query.TestDecl`:
  ``main`` is package-relative, or a label) -- :func:`main_path`, :func:`mains`;
* by convention, when no declaration is at hand (the pytest plugin must not run
  ``bazel query``): a gpu_test's default main is ``<name>.py`` in its package, so
  ``//pkg:foo_test`` -> ``pkg/foo_test.py`` (:func:`conventional_main`). A gpu_test
  whose ``main`` is another file is not mapped that way: its items then match no
  label and run (the safe side).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from fastci.types import RelPath, TestId, as_label, is_label, normalize_test_id

if TYPE_CHECKING:
    from fastci.integrations.bazel.query import TestDecl


def node_path(test_id: TestId) -> RelPath | None:
    """The file part of a pytest node id (``a/b.py::T::t`` -> ``a/b.py``); None for a label."""
    if is_label(test_id):
        return None
    path = test_id.partition("::")[0]
    return path or None


def main_path(decl: TestDecl) -> RelPath | None:
    """The repo-relative path of a gpu_test's main file (None: unknown or another repository's).

    ``main`` is package-relative (``foo_test.py``, ``sub/x.py``, ``:foo_test.py``) or
    a label (``//pkg:foo_test.py``); empty means the default (``<name>.py``).
    """
    label = as_label(decl.id)
    if label is None or label.repo:
        return None
    main = decl.main
    if not main:
        return conventional_main(decl.id)
    if is_label(main):
        src = as_label(main)
        return src.source_path() if src is not None else None
    main = main.lstrip(":")
    return f"{label.package}/{main}" if label.package else main


def mains(decls: Iterable[TestDecl]) -> dict[TestId, RelPath]:
    """Label -> repo path of its main file, for every declaration whose main is known."""
    out: dict[TestId, RelPath] = {}
    for decl in decls:
        path = main_path(decl)
        if path is not None:
            out[normalize_test_id(decl.id)] = path
    return out


def conventional_main(test_id: TestId) -> RelPath | None:
    """The default main file of the gpu_test ``test_id`` (``//p:t`` -> ``p/t.py``); None for a node id."""
    label = as_label(test_id)
    if label is None:
        return None
    src = label.source_path()
    return None if src is None else f"{src}.py"


def labels_by_main(labels: Iterable[TestId],
                   known: Mapping[TestId, RelPath] | None = None) -> dict[RelPath, TestId]:
    """Main file -> label, for the labels among ``labels``.

    ``known`` (label -> main path, from :func:`mains`) wins over the convention.
    Two labels with one main file: neither is kept (which one an item is would be a guess).
    """
    out: dict[RelPath, TestId] = {}
    clash: set[RelPath] = set()
    for test in labels:
        if not is_label(test):
            continue
        test = normalize_test_id(test)
        path = (known or {}).get(test) or conventional_main(test)
        if path is None:
            continue
        if path in out and out[path] != test:
            clash.add(path)
        out[path] = test
    return {p: t for p, t in out.items() if p not in clash}


def same_test(test_id: TestId, ids: Iterable[TestId],
              known: Mapping[TestId, RelPath] | None = None) -> list[TestId]:
    """The ids among ``ids`` that name the test ``test_id`` under the other kind of id.

    A node id -> the label whose main file holds it; a label -> the node ids of the
    items in its main file. ``known`` as for :func:`labels_by_main`.
    """
    ids = list(ids)
    if is_label(test_id):
        label = normalize_test_id(test_id)
        path = (known or {}).get(label) or conventional_main(label)
        return [t for t in ids if path is not None and node_path(t) == path]
    path = node_path(test_id)
    found = labels_by_main(ids, known).get(path) if path is not None else None
    return [found] if found is not None else []
