"""What the shared parts of the overhead benchmarks (`host_app`, `host_script`) agree on: the
setups compared, interleaved rounds, ratios to the unprofiled run of the same round, and
the report (table on stdout, JSON in benchmarks/results/).

This VM's speed jumps by up to ~1.8x for fractions of a second (other tenants), on each core
independently, so one window's CPU time can be 15% off the next one's for identical work.
Rounds visit the setups in a shuffled order and every figure is the median (and range) over
rounds of a ratio to the unprofiled window of the same round. A second unprofiled setup
(`none (A/A)`) goes through exactly the same treatment: its spread is the noise floor.
"""

from __future__ import annotations

import os
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks import results

NONE = "none"
DEFAULT_RATE = 10.0  # the host's default --sample-rate, requests per second
BOOTSTRAP = 2000  # resamples of the rounds for the median's interval


@dataclass(frozen=True)
class Setup:
    key: str  # as `--setups` names it
    name: str
    host: tuple[str, ...] | None = None  # `profiler-host run` flags; None: not under the host
    peer: str | None = None  # benchmarks.peers.IN_PROCESS name, or "py-spy"
    # the host's class patches, once in, never taken out (`benchmarks.served`)
    patches_kept: bool = False


# (CPU seconds per unit of work, units per second); a unit is a request or a script run
Measure = Callable[[Setup], tuple[float, float]]


def choose(setups: list[Setup], keys: str) -> list[Setup]:
    """The setups `keys` names (comma-separated; empty: all); none is always measured."""
    wanted = {key.strip() for key in keys.split(",") if key.strip()}
    unknown = wanted - {s.key for s in setups}
    if unknown:
        raise SystemExit(f"unknown setup(s) {sorted(unknown)}; known: {[s.key for s in setups]}")
    return [s for s in setups if not wanted or s.key in wanted or s.name == NONE]


def interleave_records(
    setups: list[Setup], rounds: int, measure: Callable, with_round: bool = False
) -> dict[str, list]:
    """setup name -> what `measure(setup)` (or `measure(setup, round number)`) returned,
    one per round; every round visits the setups in a new shuffled order."""
    rng = random.Random(1)
    records: dict[str, list] = {s.name: [] for s in setups}
    for number in range(rounds):
        order = list(setups)
        rng.shuffle(order)
        for setup in order:
            records[setup.name].append(measure(setup, number) if with_round else measure(setup))
        print(f"  round {number + 1}/{rounds} done, load average {os.getloadavg()[0]:.2f}")
    return records


def interleave_pairs(
    setups: list[Setup], rounds: int, measure_pair: Callable[[Setup], tuple]
) -> tuple[dict[str, list], dict[str, list]]:
    """Each round visits the setups but none in a new shuffled order, and `measure_pair(setup)`
    measures none and that setup at the same time: (setup name -> its records, setup name ->
    the records of none measured beside them). A pair shares the VM's speed of the moment,
    which sequential windows do not."""
    pairs = interleave_records([s for s in setups if s.name != NONE], rounds, measure_pair)
    records = {name: [record for _, record in ones] for name, ones in pairs.items()}
    bases = {name: [base for base, _ in ones] for name, ones in pairs.items()}
    return records, bases


def interleave(setups: list[Setup], rounds: int, measure: Measure) -> dict:
    """setup name -> {"cpu": [...], "rate": [...]}, one value per round."""
    records = interleave_records(setups, rounds, measure)
    return {
        name: {"cpu": [cpu for cpu, _ in ones], "rate": [rate for _, rate in ones]}
        for name, ones in records.items()
    }


def sampled_share(rate: float) -> float:
    """The share of requests the default rate samples at `rate` requests per second."""
    return min(1.0, DEFAULT_RATE / rate)


def at_default_rate(unsampled: float, recorded: float, rate: float) -> float:
    """Cost per request at the default rate, composed: a request the sampler lets pass, plus
    the sampled share of what recording one adds (assumed the same at any rate)."""
    return unsampled + sampled_share(rate) * (recorded - unsampled)


def summary(values: list[float], digits: int) -> dict:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }


def ratio_summary(values: list[float]) -> dict:
    """`summary` plus a bootstrap 90% interval of the median: how far the median itself
    could move with other rounds (the range says how far one round can)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP)
    )
    low, high = medians[BOOTSTRAP // 20], medians[BOOTSTRAP - 1 - BOOTSTRAP // 20]
    return {**summary(values, 4), "median_ci90": [round(low, 4), round(high, 4)]}


def ratios(samples: dict) -> dict:
    """Per setup: CPU ratio (none's CPU per unit / this setup's, so 1.0 = free and 0.97 = 3%
    more CPU) and rate ratio (this setup's rate / none's), each per round: against none's
    windows of the same rounds, or a setup's own `base` (none measured at the same time)."""
    out = {}
    for name, one in samples.items():
        base = one.get("base", samples[NONE])
        out[name] = {
            "cpu": summary(one["cpu"], 6),
            "cpu_ratio": ratio_summary(
                [b / c for b, c in zip(base["cpu"], one["cpu"], strict=True)]
            ),
            "rate": summary(one["rate"], 3),
            "rate_ratio": ratio_summary(
                [r / b for b, r in zip(base["rate"], one["rate"], strict=True)]
            ),
        }
    return out


def _cell(figure: dict | None) -> str:
    if figure is None:  # a modelled row has no rate
        return "-"
    low, high = figure["median_ci90"]
    return (
        f"{figure['median']:.3f} [{figure['min']:.3f}-{figure['max']:.3f}] ({low:.3f}-{high:.3f})"
    )


def report(
    name: str,
    unit: str,
    second: str,
    figures: dict,
    unavailable: dict[str, str],
    data: dict,
    extra: dict[str, str] | None = None,
) -> dict:
    """Prints the table (`second`: what the rate ratio means; `extra`: more columns, header
    -> the figures' key of a `ratio_summary`) and saves the JSON."""
    extra = extra or {}
    rows = [
        (
            setup,
            f"{row['cpu']['median'] * 1000:.3f}",
            _cell(row["cpu_ratio"]),
            _cell(row.get("rate_ratio")),
            *(_cell(row.get(key)) for key in extra.values()),
        )
        for setup, row in figures.items()
    ]
    rows += [
        (setup, "-", f"unavailable: {why}", "-", *("-" for _ in extra))
        for setup, why in unavailable.items()
    ]
    headers = (
        "setup",
        f"CPU ms/{unit}",
        "CPU ratio median [range] (median's 90% CI)",
        f"{second} [range] (CI)",
        *extra,
    )
    print(results.table(headers, rows))
    payload = {**data, "setups": figures, "unavailable": unavailable}
    path = results.save(name, payload)
    print(f"load average at start {data['load_average_at_start']}, at end {os.getloadavg()}")
    print(f"results: {path}")
    return payload
