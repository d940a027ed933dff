"""Instrumented functions pickle by value as plain ones do (issue 14).

cloudpickle (behind joblib/loky, Dask, Ray) and dill pickle closures, lambdas and functions
of modules that cannot be imported by value, code object and its constants included. The
constants the rewriter adds (the gate, the hooks, the function id) must pickle too, inside
a sampled request and outside one, without pickling a request in flight; and the loaded
function must behave as the plain one in a process where no profiler runs.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import cloudpickle
import dill
import pytest

from profiler_host import hooks, rewriter
from tests import torture_cases
from tests.pickling_cases import CASES, SOURCE, outcome
from tests.test_host_rewriter import IMPLEMENTATIONS, request

ROOT = Path(__file__).resolve().parents[1]
PICKLERS = {"cloudpickle": cloudpickle, "dill": dill}

LOADER = """
import json, pickle, sys
import {pickler} as pickler
from tests.pickling_cases import outcome

payloads = pickle.loads(sys.stdin.buffer.read())
results = {{case: outcome(case, pickler.loads(payload)) for case, payload in payloads.items()}}
runtime = sys.modules.get("profiler_host.runtime")  # imported by unpickling, not started
running = runtime is not None and runtime.active() is not None
print(json.dumps({{"results": results, "profiler_running": running}}))
"""


def functions(hooks_: rewriter.Hooks | None) -> dict[str, Any]:
    """Each case's function, from a module that cannot be imported (so picklers take it by
    value), every function instrumented with `hooks_` unless None."""
    module = types.ModuleType("made_at_run_time")
    code = compile(SOURCE, "<made at run time>", "exec")
    if hooks_ is not None:
        code = torture_cases.instrument_tree(code, hooks_, {})
    exec(code, module.__dict__)
    return {case: get(module.__dict__) for case, (get, _) in CASES.items()}


def load_elsewhere(pickler: str, payloads: dict[str, bytes]) -> dict:
    """Loads and calls the pickled functions in a fresh interpreter with no profiler."""
    done = subprocess.run(
        [sys.executable, "-c", LOADER.format(pickler=pickler)],
        input=pickle.dumps(payloads),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("pickler", list(PICKLERS))
@pytest.mark.parametrize("sampled", [False, True], ids=["unsampled", "sampled"])
@pytest.mark.parametrize("implementation", list(IMPLEMENTATIONS))
def test_instrumented_functions_pickle_by_value(
    pickler: str, sampled: bool, implementation: str
) -> None:
    plain = functions(None)
    expected = {case: outcome(case, function) for case, function in plain.items()}
    assert expected["raises"][0] == "raised" and expected["generator"][1] == [4, 3, 2, 1]

    instrumented = functions(IMPLEMENTATIONS[implementation])
    assert instrumented["lambda"].__code__.co_code != plain["lambda"].__code__.co_code
    with request(sampled=sampled) as req:
        payloads = {case: PICKLERS[pickler].dumps(f) for case, f in instrumented.items()}
        here = {case: outcome(case, PICKLERS[pickler].loads(p)) for case, p in payloads.items()}
        assert [req] == hooks.ACTIVE  # the gate in flight was not emptied or replaced
    assert here == expected
    elsewhere = load_elsewhere(pickler, payloads)
    assert elsewhere["results"] == json.loads(json.dumps(expected))
    assert elsewhere["profiler_running"] is False
