"""`./dev bench host-app-versions`: `host-app` on every supported CPython, one after the other
(each in its venv, as `host-calls-versions` runs them), and its ratios side by side.

Each version's run is a whole `host-app` run: the host's setups and the peers (cProfile and
yappi by default) against the same app uninstrumented, interleaved in the same rounds on
that interpreter, so a ratio is the version's own; only ratios are set side by side (the
versions run minutes apart on a VM whose speed drifts). Each run's own result file is kept
beside the summary."""

from __future__ import annotations

from benchmarks import results
from benchmarks.host_calls_versions import interpreters, run_on

APPS = ("flask", "starlette")  # the sample apps: the goals of the versions' table
SETUPS = "aa,off,default,cprofile,yappi"
# per setup, what the table sets side by side (host_app's figure keys, medians)
FIGURES = ("cpu_ratio", "cpu_ratio_at_latency_rate", "p99_ratio")


def summary(run: dict) -> dict[str, dict[str, float]]:
    """Setup -> the medians of FIGURES a host-app result holds for it."""
    return {
        setup: {key: figure[key]["median"] for key in FIGURES if figure.get(key)}
        for setup, figure in run["setups"].items()
    }


def run(apps: list[str], options: list[str]) -> dict:
    """`options`: host-app's own (rounds, seconds, setups), the same for every version."""
    if "--setups" not in options:
        options = [*options, "--setups", SETUPS]
    pythons = interpreters()
    out: dict[str, dict] = {}
    for app in apps:
        for version, python in pythons.items():
            one = run_on(python, ["host-app", "--app", app, *options], timeout=7200)
            out.setdefault(app, {})[version] = {
                "python": one["machine"]["python"],
                "setups": summary(one),
            }
    versions = list(pythons)
    rows = []
    for app, by_version in out.items():
        setups = list(by_version[versions[0]]["setups"])
        for setup in setups:
            cells = [by_version[v]["setups"].get(setup, {}).get("cpu_ratio") for v in versions]
            rows.append((app, setup, *("-" if c is None else f"{c:.3f}" for c in cells)))
    print(results.table(("app", "setup: CPU ratio", *versions), rows))
    path = results.save("host-app-versions", {"apps": out, "options": options})
    print(f"\nresults: {path}")
    return out
