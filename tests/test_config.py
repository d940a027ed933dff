"""Flags win over PROFILER_* env vars, env vars over defaults; bad values name their source."""

from __future__ import annotations

import pytest

from profiler_core.config import duration, size
from profiler_server import cli
from profiler_server.settings import DEFAULTS, OPTIONS


def test_defaults_match_the_documented_contract(monkeypatch) -> None:
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    settings = cli.parse([])
    assert settings == DEFAULTS
    assert settings.listen == "127.0.0.1:50051" and settings.http == "127.0.0.1:9999"
    assert settings.db == "sqlite:///profiler.db" and settings.retention == 7 * 86400


def test_flags_win_over_env_and_env_over_defaults(monkeypatch) -> None:
    monkeypatch.setenv("PROFILER_TOP_K", "50")
    monkeypatch.setenv("PROFILER_RETENTION", "12h")
    settings = cli.parse(["--top-k", "7"])
    assert settings.top_k == 7
    assert settings.retention == 12 * 3600


def test_bad_values_say_where_they_came_from(monkeypatch) -> None:
    monkeypatch.setenv("PROFILER_RETENTION", "forever")
    with pytest.raises(SystemExit, match="PROFILER_RETENTION"):
        cli.parse([])
    monkeypatch.delenv("PROFILER_RETENTION")
    with pytest.raises(SystemExit, match="--listen"):
        cli.parse(["--listen", "nowhere"])
    with pytest.raises(SystemExit, match="--top-k"):
        cli.parse(["--top-k", "0"])


def test_units() -> None:
    assert duration("500ms") == 0.5 and duration("5m") == 300 and duration("2") == 2
    assert size("4MiB") == 4 * 1024**2 and size("512K") == 512 * 1024 and size("10") == 10
    with pytest.raises(ValueError):
        size("lots")
