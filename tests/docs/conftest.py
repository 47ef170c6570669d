"""Starts the documents' commands when collection ends and runs the docs tests last.

Why: the documented commands take minutes, one process at a time, and the rest of the suite
leaves one of CI's two cores mostly idle; run beside the other tests, they cost the suite
little wall time (``tests/docs/runner.py``). Only the selected snippets' documents run (up to
their last selected snippet: an earlier one may write what a later one reads).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.docs.runner import Runner

DOCS_TESTS = "tests/docs/test_docs.py::"


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only what is selected runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    docs = [i for i in items if i.nodeid.startswith(DOCS_TESTS)]
    if not docs or config.option.collectonly:
        return
    others = [i for i in items if not i.nodeid.startswith(DOCS_TESTS)]
    last = [i for i in docs if i.name == "test_the_repository_is_left_clean"]
    items[:] = [*others, *(i for i in docs if i not in last), *last]
    wanted = {
        i.callspec.params["snip"].where
        for i in docs
        if hasattr(i, "callspec") and "snip" in i.callspec.params
    }
    from tests.docs.test_docs import SNIPPETS

    upto: dict[str, int] = {}  # per document: index of its last selected snippet
    for n, s in enumerate(SNIPPETS):
        if s.where in wanted:
            upto[s.doc] = n
    run = [s for n, s in enumerate(SNIPPETS) if n <= upto.get(s.doc, -1)]
    # beside other tests: one document at a time (the suite keeps the other core busy)
    config.dssup_docs_runner = Runner(run, workers=1 if others else 2)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    runner: Any = getattr(config, "dssup_docs_runner", None)
    if runner is not None:
        runner.close()
