"""What a user of `profiler-host run` expects without reading the manual: switches work as
bare flags, and a run that recorded less than it seems to says so at exit (it sampled
nothing; calls went past the event cap)."""

from __future__ import annotations

import pytest

from profiler_host import cli
from profiler_host.settings import HostSettings


def run_options(*argv: str) -> tuple[dict[str, str], list[str]]:
    """The env vars `profiler-host run ARGV` gives its command, and the command."""
    args, command = cli.parse(["run", *argv])
    env = cli.environment(args, command, {})
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
