"""Exports: stored requests and aggregated stacks in other tools' formats (one module per
format, see base.py), and the optional forwarding of aggregates to Pyroscope (pyroscope.py).
"""

from __future__ import annotations

from profiler_server.exports import chrome, folded, grafana, pprof, speedscope, stacks
from profiler_server.exports.base import Aggregate, Format, RequestProfile, json_bytes

FORMATS = {m.FORMAT.name: m.FORMAT for m in (folded, stacks, speedscope, chrome, grafana, pprof)}
# What each route offers, in the documented order; the first is the default.
REQUEST_FORMATS = ("speedscope", "chrome", "folded")
AGGREGATE_FORMATS = ("folded", "json", "grafana", "speedscope", "pprof")

__all__ = [
    "AGGREGATE_FORMATS",
    "FORMATS",
    "REQUEST_FORMATS",
    "Aggregate",
    "Format",
    "RequestProfile",
    "json_bytes",
]
