"""What a user of `profiler-host run` expects without reading the manual: switches work as
bare flags, and a run that recorded less than it seems to says so at exit (it sampled
nothing; calls went past the event cap)."""

from __future__ import annotations

import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiler_host import cli, hooks, recording, rewriter
from profiler_host.default_include import default_include
from profiler_host.settings import HostSettings
from tests.helpers import eventually, stored_requests
from tests.processes import ServerProcess, free_port, host, sqlite_server


def run_options(*argv: str) -> tuple[dict[str, str], list[str]]:
    """The env vars `profiler-host run ARGV` gives its command, and the command."""
    args, command = cli.parse(["run", *argv])
    env = cli.environment(args, command, {}, default_include(command, Path.cwd()))
    return {k: v for k, v in env.items() if k.startswith("PROFILER_")}, command


def whole_process(env: dict[str, str]) -> bool:
    return HostSettings.load(environ=env).whole_process


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--whole-process", "--", "python", "job.py"], True),
        (["--whole-process", "python", "job.py"], True),
        (["--whole-process", "true", "python", "job.py"], True),
        (["--whole-process", "false", "--", "python", "job.py"], False),
        (["--whole-process=off", "python", "job.py"], False),
        (["--whole-process", "--propagate", "false", "python", "job.py"], True),
        (["--service", "s", "python", "job.py"], False),
    ],
)
def test_switches_work_as_bare_flags(argv: list[str], expected: bool):
    env, command = run_options(*argv)
    assert command == ["python", "job.py"]
    assert whole_process(env) is expected


def test_a_bare_switch_leaves_the_command_its_options():
    env, command = run_options("--propagate", "--whole-process", "python", "-u", "job.py")
    assert command == ["python", "-u", "job.py"]
    assert env["PROFILER_PROPAGATE"] == "true" and whole_process(env)


def test_a_switch_with_a_word_that_is_no_truth_value():
    """Given with `=`, the word is the switch's (and wrong); alone, it begins COMMAND."""
    with pytest.raises(ValueError, match="PROFILER_WHOLE_PROCESS"):
        run_options("--whole-process=ture", "--", "python", "job.py")
    with pytest.raises(SystemExit, match="command not found: ture"):
        cli.main(["run", "--whole-process", "ture", "--", "python", "job.py"])


def test_switches_are_listed_as_such_and_prefixes_still_work(capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "[--whole-process [true|false]]" in capsys.readouterr().out
    env, command = run_options("--whole", "python", "job.py")
    assert command == ["python", "job.py"] and whole_process(env)


@pytest.mark.parametrize("text", ["1", "true", "yes", "on", "TRUE"])
def test_switches_env_var_forms(text: str):
    assert HostSettings.load(environ={"PROFILER_WHOLE_PROCESS": text}).whole_process
    assert not HostSettings.load(environ={"PROFILER_WHOLE_PROCESS": ""}).whole_process


JOB = """
def work(n):
    return n + 1

for i in range(1000):
    work(i)
"""
PROFILED_STEP = """
import profiler_host

def work(n):
    return n + 1

with profiler_host.profile_request("step"):
    work(1)
"""
FORKING = """
import multiprocessing

def work(n):
    return n + 1

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        print(sum(pool.map(work, range(10))))
"""


def run_script(
    tmp_path: Path, source: str, *options: str, server: str | None = None
) -> subprocess.CompletedProcess:
    """`source` as a script under `profiler-host run OPTIONS` (no server listening unless
    one is given)."""
    script = tmp_path / "job.py"
    script.write_text(source)
    target, flush = (server, "30s") if server else (f"127.0.0.1:{free_port()}", "0s")
    command = host(
        "--server", target, "--flush-timeout", flush, *options, "--", sys.executable, str(script),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done


def test_a_run_that_sampled_nothing_says_so_once_with_the_hint(tmp_path: Path):
    stderr = run_script(tmp_path, JOB).stderr
    assert stderr.count("request-profiler: nothing was sampled") == 1, stderr
    assert "--whole-process" in stderr


@pytest.mark.parametrize(
    ("source", "options"),
    [(JOB, ("--whole-process",)), (PROFILED_STEP, ()), (FORKING, ("--whole-process",))],
    ids=["whole-process", "profile_request", "forked-whole-process"],
)
def test_a_run_that_sampled_does_not_say_it_sampled_nothing(
    tmp_path: Path, source: str, options: tuple[str, ...]
):
    assert "nothing was sampled" not in run_script(tmp_path, source, *options).stderr


def test_forked_children_leave_the_notice_to_their_parent(tmp_path: Path):
    stderr = run_script(tmp_path, FORKING).stderr
    assert stderr.count("nothing was sampled") == 1, stderr


def test_calls_past_the_event_cap_unrecorded_in_both_hook_implementations():
    def work(n):
        return n + 1

    for implementation in {hooks.PYTHON_HOOKS, hooks.HOOKS}:
        code = rewriter.rewrite(work.__code__, 1, implementation)
        twin = types.FunctionType(code, work.__globals__, "work")
        request = recording.Request(1, "/cap", "GET", event_cap=6)  # 3 calls
        token = recording.CURRENT.set(request.main)
        hooks.ACTIVE.append(request)
        try:
            assert [twin(n) for n in range(5)] == [1, 2, 3, 4, 5]  # all five ran
        finally:
            hooks.ACTIVE.remove(request)
            recording.CURRENT.reset(token)
        assert (request.truncated, request.unrecorded) == (True, 2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with sqlite_server(tmp_path) as proc:
        yield proc


def test_a_whole_process_run_over_the_event_cap_says_how_many_calls_it_missed(
    tmp_path: Path, server: ServerProcess
):
    options = ("--service", "capped", "--whole-process", "--max-request-events", "100")
    stderr = run_script(tmp_path, JOB, *options, server=server.target).stderr
    assert stderr.count("950 calls after that were not recorded") == 1, stderr
    assert "Raise --max-request-events (PROFILER_MAX_REQUEST_EVENTS)" in stderr
    (stored,) = eventually(lambda: stored_requests(server.http, service="capped"), 30)
    assert stored["truncated"] is True and stored["calls"] == 50
