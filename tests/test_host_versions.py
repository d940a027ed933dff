"""The host on each CPython version (issue 16): the layout chosen at start-up, the clean
refusal on versions without one, the code cache keyed by interpreter version, and no
sampling while another tool watches execution."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from profiler_host import codecache, layouts, observers

ROOT = Path(__file__).resolve().parents[1]


def test_this_interpreter_has_its_layout() -> None:
    assert sys.version_info[:2] in layouts.SUPPORTED
    assert layouts.LAYOUT is not None and layouts.LAYOUT.version == sys.version_info[:2]
    assert layouts.for_version((3, 10)) is None and layouts.for_version((3, 14)) is None


REFUSED = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from profiler_host import layouts
layouts.LAYOUT = None  # as on a version the host is not built for

def work():
    return 41 + 1

plain = work.__code__
import profiler_host
profiler_host.start(server="127.0.0.1:9", include=["__main__"])
hooked = any("Instrumenting" in type(finder).__name__ for finder in sys.meta_path)
print(work(), work.__code__ is plain, hooked)
profiler_host.stop()
"""


def test_a_version_without_a_layout_runs_unchanged_with_one_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42", "True", "False"]
    warnings = [line for line in done.stderr.splitlines() if "not supported" in line]
    assert len(warnings) == 1, done.stderr
    built = ", ".join(f"{major}.{minor}" for major, minor in layouts.SUPPORTED)
    assert f"built for {built}" in warnings[0] and "nothing is instrumented" in warnings[0]


def test_code_cache_entries_differ_by_interpreter_version(monkeypatch) -> None:
    """Rewritten code of one interpreter is never loaded by another: the full version is
    part of every key (a patch release changes it too)."""
    here = codecache._rewriter_fingerprint()
    monkeypatch.setattr(sys, "version", sys.version.replace(".", "!", 1))
    assert codecache._rewriter_fingerprint() != here


def test_a_tracer_means_watched() -> None:
    assert not observers.watched()
    sys.settrace(lambda *args: None)
    try:
        assert observers.watched()
    finally:
        sys.settrace(None)
    assert not observers.watched()


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
@pytest.mark.parametrize("tool", range(6))
def test_a_monitoring_tool_means_watched(tool: int) -> None:
    """Any of sys.monitoring's tool ids in use (coverage's sysmon core takes 1), even with
    no event set yet."""
    sys.monitoring.use_tool_id(tool, "test")
    try:
        assert observers.watched()
    finally:
        sys.monitoring.free_tool_id(tool)
    assert not observers.watched()
