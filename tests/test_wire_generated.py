"""The checked-in generated code matches protos/ (regenerate with `./dev protos`)."""

from pathlib import Path

from profiler_core.wire import generate


def test_generated_code_is_current(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert fresh, "protoc produced nothing"
    for rel in fresh:
        checked_in = generate.ROOT / rel
        assert checked_in.exists(), f"{rel} is missing: run ./dev protos"
        assert checked_in.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} is stale versus protos/: run ./dev protos"
        )
