"""`profiler-host run [options] -- COMMAND ...`: profiles every Python process of COMMAND.

Flags become `PROFILER_*` env vars (so child processes see them too), the directory of
our `sitecustomize` goes first on PYTHONPATH, and COMMAND replaces this process.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from profiler_core.config import build_parser, explicit
from profiler_host.default_include import Default, default_include
from profiler_host.settings import BY_NAME, OPTIONS, HostSettings

SITE_DIR = Path(__file__).resolve().parent / "site"
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
INCLUDE_ENV = BY_NAME["include"].env


def script_command(command: list[str]) -> list[str]:
    """`python FILE ...` becomes `python -m profiler_host.script FILE ...` (see script.py)."""
    is_python = len(command) >= 2 and _PYTHON.match(os.path.basename(command[0]))
    if is_python and command[1].endswith(".py") and not command[1].startswith("-"):
        return [command[0], "-m", "profiler_host.script", *command[1:]]
    return command


def environment(
    args: argparse.Namespace, command: list[str], base: dict[str, str], default: Default
) -> dict:
    """The command's environment: the options as env vars over `base`, `default`'s globs
    where no `--include` is given."""
    env = dict(base)
    for option in OPTIONS:
        value = getattr(args, option.dest)
        if value is not None:
            env[option.env] = value
    env.setdefault(INCLUDE_ENV, ",".join(default.globs))
    env.setdefault(BY_NAME["service"].env, os.path.basename(command[0]))
    HostSettings.load(environ=env)  # fail here, with the option's name, not in the app
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), base.get("PYTHONPATH")]))
    return env


def include_notice(default: Default) -> str:
    """What is instrumented without `--include`, said once at start."""
    return (
        f"profiler-host: instrumenting {', '.join(default.globs)} ({default.why}); "
        f"--include (or {INCLUDE_ENV}) names the modules to instrument instead, e.g. "
        "--include myproject,myapp"
    )


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options and COMMAND of `run [options] [--] COMMAND ...` (`argv` from `run`)."""
    parser = build_parser(
        "profiler-host run",
        "Runs COMMAND with every Python process in it profiled (no change to the app).",
        OPTIONS,
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(explicit(argv[1:], OPTIONS))
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND given (profiler-host run [options] -- COMMAND ...)")
    return args, command


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "run":
        sys.exit("usage: profiler-host run [options] -- COMMAND [ARGS...]  (see --help)")
    args, command = parse(argv)
    default = default_include(command, Path.cwd())
    try:
        env = environment(args, command, dict(os.environ), default)
    except ValueError as exc:
        sys.exit(f"profiler-host: {exc}")
    if args.include is None and INCLUDE_ENV not in os.environ:
        print(include_notice(default), file=sys.stderr)
    executable = shutil.which(command[0], path=env.get("PATH"))
    if executable is None:
        sys.exit(f"profiler-host: command not found: {command[0]}")
    os.execvpe(executable, script_command(command), env)


if __name__ == "__main__":
    main()
