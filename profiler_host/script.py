"""`python -m profiler_host.script FILE [ARGS...]`: runs a script as `__main__` with its own
functions instrumented. The interpreter runs a script file without the import system, so
no import hook can see it; `profiler-host run -- python FILE` goes through here instead."""

from __future__ import annotations

import os
import sys
import types

from profiler_host.runtime import active


def run(path: str, argv: list[str]) -> None:
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec", dont_inherit=True)
    profiler = active()
    if profiler is not None and profiler.filter("__main__"):
        code = profiler.instrumenter.transform(code, "__main__")
    main = types.ModuleType("__main__")
    main.__file__ = path
    vars(main)["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv[:] = [path, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    exec(code, main.__dict__)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m profiler_host.script FILE [ARGS...]")
    run(sys.argv[1], sys.argv[2:])
