"""The README's first command: the demo runs the server and both sample apps under
`profiler-host run`, drives traffic at them and says where to look; Ctrl-C ends it all."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from profiler_server.demo.children import answers
from tests.helpers import eventually, stored_requests
from tests.processes import free_port


def demo(*options: str) -> tuple[list[str], dict[str, int]]:
    """The demo's command on free loopback ports, and those ports."""
    ports = {name: free_port() for name in ("grpc", "http", "flask", "starlette")}
    command = [
        sys.executable, "-m", "profiler_server.demo", "--rounds", "5",
        "--grpc", f"127.0.0.1:{ports['grpc']}", "--http", f"127.0.0.1:{ports['http']}",
        "--flask-port", str(ports["flask"]), "--starlette-port", str(ports["starlette"]),
        *options,
    ]  # fmt: skip
    return command, ports


def still_serving(ports: dict[str, int]) -> list[str]:
    """Which of the demo's HTTP servers (the profiler-server's side, both apps) still answer."""
    health = {"http": "/healthz", "flask": "/health", "starlette": "/health"}
    return [
        name for name, path in health.items() if answers(f"http://127.0.0.1:{ports[name]}{path}")
    ]


def test_demo_profiles_both_apps_and_points_at_real_data(tmp_path: Path, start_server) -> None:
    command, ports = demo("--exit")
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    http = f"http://127.0.0.1:{ports['http']}"
    for where in ("/", "/api/requests", "/metrics"):
        assert f"{http}{where}" in out
    assert "Slowest sampled requests of each app:" in out
    slowest = [line for line in out.splitlines() if " ms  " in line and "/api/requests/" in line]
    assert {line.split()[2] for line in slowest} == {"shop-flask", "shop-starlette"}, out
    assert "most time in: profiling_target." in out, out
    output = tmp_path / "demo-output"
    folded = (output / "flamegraph.folded").read_text().splitlines()
    assert folded and all(int(line.rsplit(" ", 1)[1]) >= 0 for line in folded)
    assert any("profiling_target.delays:crunch_numbers" in line for line in folded)

    # everything stopped; what it stored is in the demo's database
    assert still_serving(ports) == []
    server = start_server(f"sqlite:///{output / 'profiler.db'}")
    flask = stored_requests(server.http, service="shop-flask")
    starlette = stored_requests(server.http, service="shop-starlette")
    assert {"/checkout", "/report", "/slow"} <= {r["route"] for r in flask}
    assert {"/products/export", "/block", "/report"} <= {r["route"] for r in starlette}
    assert len({r["id"].rsplit("-", 1)[0] for r in flask}) == 2  # one session per worker


def test_ctrl_c_stops_the_server_and_both_apps(tmp_path: Path) -> None:
    command, ports = demo("--rounds", "1")
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        running = eventually(lambda: "press Ctrl-C" in log.read_text(), timeout=90, interval=0.2)
        assert running, log.read_text()
        assert still_serving(ports) == ["http", "flask", "starlette"]
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "stopping ..." in log.read_text()
    assert still_serving(ports) == []


def test_a_port_that_answers_in_another_protocol_is_not_an_app_answering(
    tmp_path: Path, start_server
) -> None:
    """An app port that something else holds (here a gRPC server, which answers HTTP/1.1 with
    an HTTP/2 frame) reads as not answering: the demo then says which app did not start."""
    server = start_server(f"sqlite:///{tmp_path / 'profiler.db'}")
    assert not answers(f"http://{server.target}/health")
    assert answers(f"{server.http}/healthz")
