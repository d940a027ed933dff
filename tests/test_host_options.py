"""Host options, the wrapper command's environment, and the sampler's arithmetic."""

from __future__ import annotations

import argparse
import os
import random
import re
from pathlib import Path

import pytest

from profiler_host import cli
from profiler_host import sampler as reference
from profiler_host.default_include import MAX_NEIGHBOURS, Default, default_include
from profiler_host.native import extension
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
    default = Default(("profiling_target", "tests"), "the app's code")
    env = cli.environment(args, command, {"PYTHONPATH": "/user/lib"}, default)
    assert env["PROFILER_SAMPLE_RATE"] == "5"
    assert env["PROFILER_INCLUDE"] == "profiling_target,tests"
    assert env["PROFILER_SERVICE"] == "gunicorn"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(cli.SITE_DIR), "/user/lib"]
    assert (cli.SITE_DIR / "sitecustomize.py").is_file()
    given = cli.environment(args, command, {"PROFILER_INCLUDE": "shop.*"}, default)
    assert given["PROFILER_INCLUDE"] == "shop.*"


def project(root: Path, *names: str) -> Path:
    """Files and package directories (names ending in `/`) under `root`."""
    for name in names:
        if name.endswith("/"):
            (root / name).mkdir(parents=True)
            (root / name / "__init__.py").write_text("")
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("")
    return root


def test_without_include_the_apps_own_code_is_instrumented(tmp_path: Path):
    """A Django project: the package of `wsgi.py` and the apps beside it, not what is no
    package (a virtualenv, static files) nor names of the standard library."""
    root = project(tmp_path, "mysite/", "mysite/wsgi.py", "polls/", "manage.py", "json/",
                   "venv/lib/x.py", "static/app.js", ".hidden/", "not-a-name.py")  # fmt: skip
    default = default_include(["gunicorn", "mysite.wsgi:application"], root)
    assert default.globs == ("manage", "mysite", "polls")
    assert str(root) in default.why
    elsewhere = default_include(["uvicorn", "--app-dir", "src", "main:app"], tmp_path.parent)
    assert elsewhere.globs == ("main.*",)  # no main.py where the app is imported from
    project(tmp_path, "src/main.py", "src/models.py")
    in_src = default_include(["uvicorn", "--app-dir=src", "main:app"], tmp_path)
    assert in_src.globs == ("main", "models")
    assert default_include(["python", "job.py"], root).globs == ("__main__",)


def test_a_crowded_directory_is_no_project(tmp_path: Path):
    project(tmp_path, "app.py", *(f"m{i}.py" for i in range(MAX_NEIGHBOURS + 1)))
    assert default_include(["uvicorn", "app:app"], tmp_path).globs == ("app.*",)


def test_scripts_run_through_the_script_runner():
    assert cli.script_command(["python3", "job.py", "-x"]) == [
        "python3", "-m", "profiler_host.script", "job.py", "-x",
    ]  # fmt: skip
    assert cli.script_command(["python", "-m", "pkg"]) == ["python", "-m", "pkg"]
    assert cli.script_command(["gunicorn", "app.py"]) == ["gunicorn", "app.py"]


_sampling = extension("_sampling")
# the sampler: the Python reference and, when built, the C twin (which keys route shapes
# by a hash of the shape, never built: the decisions below compare them)
SAMPLERS = {"python": reference.Sampler}
if _sampling is not None:
    SAMPLERS["c"] = _sampling.Sampler


@pytest.fixture(params=list(SAMPLERS))
def Sampler(request):
    return SAMPLERS[request.param]


def test_the_c_sampler_is_in_use_when_built():
    """An install builds it (./dev setup, CI); the host then uses it."""
    if os.environ.get("PROFILER_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("PROFILER_PURE_PYTHON=1 selects the Python sampler")
    assert _sampling is not None, "profiler_host._sampling is not built"
    assert type(reference.new_sampler(10, 60)) is _sampling.Sampler


def test_route_shapes_fold_ids():
    route_shape = reference.route_shape
    assert route_shape("/orders/17/items/3") == "/orders/:id/items/:id"
    assert route_shape("/users/3f2c9a1e-8b7d-4c2a-9e1f-0a1b2c3d4e5f") == "/users/:id"
    assert route_shape("/products/export") == "/products/export"
    assert route_shape("/blobs/deadbeefdeadbeef/x") == "/blobs/:id/x"  # 16 hex characters
    assert route_shape("/blobs/deadbeefdeadbee/x") == "/blobs/deadbeefdeadbee/x"  # 15
    assert route_shape("/v2/items/") == "/v2/items/"
    assert route_shape("/reports/2024-Q1/٣") == "/reports/2024-Q1/:id"  # a Unicode digit
    assert route_shape("/café/٣/😀/12") == "/café/:id/😀/:id"


def test_the_sampler_counts_every_request_it_decides_on(Sampler):
    """What tells a process that served requests from one that was never offered any."""
    sampler = Sampler(0.0, 60.0)
    assert sampler.seen == 0
    for _ in range(3):
        assert not sampler.decide("/a")
    assert sampler.seen == 3
    sampler = Sampler(5.0, 60.0)
    sampler.decide("/a")
    sampler.decide("/a")
    assert sampler.seen == 2


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
        assert reference.route_shape("/".join(segments)) == expected


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(
    sampler: reference.Sampler, clock: FakeClock, per_second: int, seconds: int, path: str
) -> int:
    sampled = 0
    for _ in range(seconds):
        for _ in range(per_second):
            clock.now += 1.0 / per_second
            sampled += sampler.decide(path)
    return sampled


def test_sampling_probability_falls_as_load_rises(Sampler):
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


def test_a_burst_after_a_quiet_spell_stays_within_the_rate(Sampler):
    clock = FakeClock()
    sampler = Sampler(rate=10, route_interval=60, clock=clock, chance=lambda: 0.0)
    run(sampler, clock, per_second=1, seconds=30, path="/a")  # quiet: the estimate falls
    clock.now += 1.5
    assert sampler.decide("/a")  # a new window starts
    burst = sum(sampler.decide("/a") for _ in range(1000))  # within that second
    assert burst == 9  # the window's 10 in all


def test_first_request_of_each_route_is_sampled(Sampler):
    clock = FakeClock()
    sampler = Sampler(rate=1, route_interval=60, clock=clock, chance=lambda: 0.999)
    assert sampler.decide("/rare/1")
    assert not sampler.decide("/rare/2")  # same shape within the interval
    clock.now += 61
    assert sampler.decide("/rare/3")
    assert not Sampler(rate=0, clock=clock).decide("/x")  # 0: sampling off


@pytest.mark.skipif(_sampling is None, reason="the C sampler is not built or not wanted")
@pytest.mark.parametrize("seed", range(5))
def test_c_and_python_samplers_decide_alike(seed: int) -> None:
    """Random arrivals (bursts, quiet spells, new and repeated route shapes, more shapes
    than are remembered) with one clock and one stream of chances: the same decisions."""
    rng = random.Random(seed)
    clock = FakeClock()
    chances = [rng.random() for _ in range(40_000)]
    rate = rng.choice((0.5, 1, 2))
    twins = [
        make(rate, route_interval=5, clock=clock, chance=iter(chances).__next__)
        for make in (reference.Sampler, _sampling.Sampler)
    ]
    decisions: list[list[bool]] = [[], []]
    for _ in range(20_000):
        clock.now += rng.choice((0.0, 0.0001, 0.001, 0.01, 0.3, 1.7))
        path = rng.choice(
            (
                "/a",
                "/orders/17",
                "/orders/:id",  # the shape of the one above
                f"/x/{rng.randrange(3000)}/y",
                f"/p{rng.randrange(1500)}",
                f"/é/{rng.randrange(10)}/٣",
                f"/h/{rng.randrange(16**16):016x}/{rng.randrange(16**15):015x}",
                "/v2//items/",
            )
        )
        for decided, twin in zip(decisions, twins, strict=True):
            decided.append(twin.decide(path))
    assert decisions[0] == decisions[1]
    assert twins[0].probability == twins[1].probability
    assert 0 < sum(decisions[0]) < len(decisions[0])
