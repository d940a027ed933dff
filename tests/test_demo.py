"""The README's first command: the demo starts a server, sends traffic and says where to look."""

from __future__ import annotations

import subprocess
import sys

from tests.processes import free_port


def test_demo_runs_and_points_at_real_data(tmp_path) -> None:
    grpc_port, http_port = free_port(), free_port()
    done = subprocess.run(
        [sys.executable, "-m", "profiler_server.demo", "--exit", "--seconds", "2",
         "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "Slowest sampled requests:" in out
    rows = [line for line in out.splitlines() if " ms  " in line and "/api/requests/" in line]
    assert len(rows) == 5
    assert f"http://127.0.0.1:{http_port}/metrics" in out
    folded = (tmp_path / "flamegraph.folded").read_text().splitlines()
    assert folded and all(int(line.rsplit(" ", 1)[1]) > 0 for line in folded)
    assert (tmp_path / "profiler.db").exists()
