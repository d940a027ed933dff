"""A pytest plugin for the third-party suites that use Hypothesis (`-p steady_hypothesis`, in
every run of the suite, plain ones too): the same examples in every run (derandomized, no
example database), so the runs compare test by test, and no deadline per example, a timing
check that recording every call, a tracer or the debug allocator can trip. It loads its
profile after the suite's own conftest has loaded one, keeping that one's other settings.
"""

from __future__ import annotations

import pytest
from hypothesis import settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    settings.register_profile(
        "request-profiler-steady",
        settings(settings.default, deadline=None, derandomize=True, database=None),
    )
    settings.load_profile("request-profiler-steady")
