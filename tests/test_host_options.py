"""Host options, the wrapper command's environment, and the sampler's arithmetic."""

from __future__ import annotations

import argparse
import os
import random
import re

import pytest

from profiler_host import cli
from profiler_host.sampler import Sampler, route_shape
from profiler_host.settings import OPTIONS, HostSettings


def test_keyword_options_win_over_env_and_env_over_defaults():
    env = {"PROFILER_SAMPLE_RATE": "3", "PROFILER_SERVICE": "env-svc"}
    settings = HostSettings.load({"service": "kw-svc"}, environ=env)
    assert settings.service == "kw-svc"
    assert settings.sample_rate == 3.0
    assert settings.buffer == 32 * 1024**2 and settings.max_request_events == 200_000
    assert settings.include == () and settings.whole_process is False


def test_bad_values_name_their_source():
    with pytest.raises(ValueError, match="PROFILER_BUFFER"):
        HostSettings.load(environ={"PROFILER_BUFFER": "lots"})
    with pytest.raises(TypeError, match="sample_rat"):
        HostSettings.load({"sample_rat": 1}, environ={})


def test_wrapper_environment():
    args = argparse.Namespace(**{o.dest: None for o in OPTIONS})
    args.sample_rate = "5"
    command = ["gunicorn", "-w", "2", "profiling_target.wsgi:app"]
    env = cli.environment(args, command, {"PYTHONPATH": "/user/lib"})
    assert env["PROFILER_SAMPLE_RATE"] == "5"
    assert env["PROFILER_INCLUDE"] == "profiling_target.*"
    assert env["PROFILER_SERVICE"] == "gunicorn"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cli.SITE_DIR), "/user/lib"]
    assert (cli.SITE_DIR / "sitecustomize.py").is_file()
    given = cli.environment(args, command, {"PROFILER_INCLUDE": "shop.*"})
    assert given["PROFILER_INCLUDE"] == "shop.*"


def test_scripts_run_through_the_script_runner():
    assert cli.script_command(["python3", "job.py", "-x"]) == [
        "python3", "-m", "profiler_host.script", "job.py", "-x",
    ]  # fmt: skip
    assert cli.script_command(["python", "-m", "pkg"]) == ["python", "-m", "pkg"]
    assert cli.script_command(["gunicorn", "app.py"]) == ["gunicorn", "app.py"]


def test_route_shapes_fold_ids():
    assert route_shape("/orders/17/items/3") == "/orders/:id/items/:id"
    assert route_shape("/users/3f2c9a1e-8b7d-4c2a-9e1f-0a1b2c3d4e5f") == "/users/:id"
    assert route_shape("/products/export") == "/products/export"
    assert route_shape("/blobs/deadbeefdeadbeef/x") == "/blobs/:id/x"  # 16 hex characters
    assert route_shape("/blobs/deadbeefdeadbee/x") == "/blobs/deadbeefdeadbee/x"  # 15
    assert route_shape("/v2/items/") == "/v2/items/"
    assert route_shape("/reports/2024-Q1/٣") == "/reports/2024-Q1/:id"  # a Unicode digit


def test_route_shapes_follow_the_documented_pattern_on_random_paths():
    """Numbers, and hex ids of 16+ characters, as docs/host.md's route shapes say."""
    pattern = re.compile(r"^(\d+|[0-9a-fA-F-]{16,})$")
    rng = random.Random(7)
    alphabet = "0123456789abcdefxyzABCDEF-_.٣"
    for _ in range(5000):
        segments = [
            "".join(rng.choice(alphabet) for _ in range(rng.choice((0, 1, 3, 15, 16, 17, 36))))
            for _ in range(rng.randint(1, 5))
        ]
        expected = "/".join(":id" if pattern.match(seg) else seg for seg in segments)
        assert route_shape("/".join(segments)) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(sampler: Sampler, clock: FakeClock, per_second: int, seconds: int, path: str) -> int:
    sampled = 0
    for _ in range(seconds):
        for _ in range(per_second):
            clock.now += 1.0 / per_second
            sampled += sampler.decide(path)
    return sampled


def test_sampling_probability_falls_as_load_rises():
    clock = FakeClock()
    chances = iter([i / 997 % 1 for i in range(10**6)])  # deterministic, evenly spread
    sampler = Sampler(rate=10, route_interval=60, clock=clock, chance=lambda: next(chances))
    light = run(sampler, clock, per_second=5, seconds=20, path="/a")
    assert light >= 95  # below the target everything is sampled
    learning = run(sampler, clock, per_second=1000, seconds=5, path="/a")
    assert learning < 5 * 1000 / 4  # the chance drops within the first second
    heavy = run(sampler, clock, per_second=1000, seconds=20, path="/a")
    assert 160 <= heavy <= 240  # about 10 per second once the rate is learnt
    assert sampler.probability < 0.02


def test_a_burst_after_a_quiet_spell_stays_within_the_rate():
    clock = FakeClock()
    sampler = Sampler(rate=10, route_interval=60, clock=clock, chance=lambda: 0.0)
    run(sampler, clock, per_second=1, seconds=30, path="/a")  # quiet: the estimate falls
    clock.now += 1.5
    assert sampler.decide("/a")  # a new window starts
    burst = sum(sampler.decide("/a") for _ in range(1000))  # within that second
    assert burst == 9  # the window's 10 in all


def test_first_request_of_each_route_is_sampled():
    clock = FakeClock()
    sampler = Sampler(rate=1, route_interval=60, clock=clock, chance=lambda: 0.999)
    assert sampler.decide("/rare/1")
    assert not sampler.decide("/rare/2")  # same shape within the interval
    clock.now += 61
    assert sampler.decide("/rare/3")
    assert not Sampler(rate=0, clock=clock).decide("/x")  # 0: sampling off
