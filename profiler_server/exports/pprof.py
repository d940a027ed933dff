"""pprof's profile.proto, gzipped (what `go tool pprof`, Pyroscope and Grafana read): one
sample per stack with [calls, value], the aggregate's value (states.VALUES: wall, running,
awaiting or ready ns) the default sample type (with `value=calls`, calls alone); a location
per function, named `module:qualname`, with its file and first line when the store knows
them."""

from __future__ import annotations

import gzip

from profiler_core.stacks import SEPARATOR
from profiler_core.wire import pprof_pb2
from profiler_server.exports.base import Aggregate, Format


class _Strings:
    """The profile's string table: index 0 must be the empty string."""

    def __init__(self, profile: pprof_pb2.Profile) -> None:
        self.table = profile.string_table
        self.index: dict[str, int] = {}
        self("")

    def __call__(self, text: str) -> int:
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.table)
            self.table.append(text)
        return found


def render_aggregate(aggregate: Aggregate) -> bytes:
    profile = pprof_pb2.Profile()
    strings = _Strings(profile)
    value = aggregate.value
    types = [("calls", "count")] + ([(value.name, value.unit)] if value.name != "calls" else [])
    for kind, unit in types:
        profile.sample_type.add(type=strings(kind), unit=strings(unit))
    profile.default_sample_type = strings(value.name)
    profile.period_type.type, profile.period_type.unit = strings("wall"), strings("nanoseconds")
    profile.period = 1
    if aggregate.since_ns is not None:
        profile.time_nanos = aggregate.since_ns
        if aggregate.until_ns is not None:
            profile.duration_nanos = max(0, aggregate.until_ns - aggregate.since_ns)
    stacks = [(sig.split(SEPARATOR), weight, calls) for sig, weight, calls in aggregate.stacks]
    ids: dict[str, int] = {}  # function name -> function id = location id
    for frames, _, _ in stacks:
        for frame in frames:
            ids.setdefault(frame, len(ids) + 1)
    sources = aggregate.sources(list(ids))
    for name, fid in ids.items():
        file, line = sources.get(name, (name.partition(":")[0], 0))
        profile.function.add(
            id=fid,
            name=strings(name),
            system_name=strings(name),
            filename=strings(file),
            start_line=line,
        )
        profile.location.add(id=fid).line.add(function_id=fid, line=line)
    for frames, weight, calls in stacks:
        values = [calls, weight][: len(types)]
        profile.sample.add(location_id=[ids[f] for f in reversed(frames)], value=values)
    return gzip.compress(profile.SerializeToString(), mtime=0)


FORMAT = Format(
    "pprof",
    "application/octet-stream",
    "pb.gz",
    aggregate=render_aggregate,
)
