"""Put on PYTHONPATH by `profiler-host run`: starts the profiler in every Python process of
the command, then runs the user's own sitecustomize (if any) as it would have run."""

import os
import sys


def _chain_user_sitecustomize() -> None:
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    here = os.path.dirname(os.path.abspath(__file__))
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", paths)
    if spec is not None and spec.loader is not None:
        module = module_from_spec(spec)
        spec.loader.exec_module(module)


def _boot() -> None:
    try:
        from profiler_host.bootstrap import boot

        boot()
    except Exception as exc:  # the app must run even if the profiler cannot
        print(f"request-profiler: not started: {exc}", file=sys.stderr)


_boot()
_chain_user_sitecustomize()
