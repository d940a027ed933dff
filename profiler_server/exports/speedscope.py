"""speedscope's file format (https://www.speedscope.app/file-format-schema.json, from
jlfwong/speedscope src/lib/file-format-spec.ts): one request as an evented profile per lane
(open/close events, so its time order shows), an aggregate as one sampled profile weighted
by the aggregate's value."""

from __future__ import annotations

from profiler_core.stacks import SEPARATOR
from profiler_server.assembly.request_tree import Lane
from profiler_server.exports.base import Aggregate, Format, RequestProfile, json_bytes
from profiler_server.exports.timeline import spans

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
EXPORTER = "request-profiler"


class _Frames:
    """The file's shared frame table: one entry per function name."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, name: str) -> int:
        found = self.index.get(name)
        if found is None:
            found = self.index[name] = len(self.index)
        return found

    def table(self) -> list[dict]:
        return [{"name": name} for name in self.index]


def _file(name: str, frames: _Frames, profiles: list[dict]) -> bytes:
    return json_bytes(
        {
            "$schema": SCHEMA,
            "exporter": EXPORTER,
            "name": name,
            "activeProfileIndex": 0,
            "shared": {"frames": frames.table()},
            "profiles": profiles,
        }
    )


def _lane_profile(lane: Lane, frames: _Frames) -> dict:
    events: list[dict] = []
    opened: list = []
    for span in spans(lane.root):
        while opened and opened[-1].depth >= span.depth:
            done = opened.pop()
            events.append({"type": "C", "frame": frames(done.node.function), "at": done.end_ns})
        events.append({"type": "O", "frame": frames(span.node.function), "at": span.start_ns})
        opened.append(span)
    while opened:
        done = opened.pop()
        events.append({"type": "C", "frame": frames(done.node.function), "at": done.end_ns})
    return {
        "type": "evented",
        "name": f"{lane.name} ({lane.kind} lane {lane.id})",
        "unit": "nanoseconds",
        "startValue": events[0]["at"],
        "endValue": events[-1]["at"],
        "events": events,
    }


def render_request(profile: RequestProfile) -> bytes:
    s = profile.summary
    frames = _Frames()
    lanes = [_lane_profile(lane, frames) for lane in profile.lanes]
    return _file(f"{s['service']} {s['method']} {s['route']} {s['id']}", frames, lanes)


def render_aggregate(aggregate: Aggregate) -> bytes:
    frames = _Frames()
    samples, weights = [], []
    for sig, weight, _ in aggregate.stacks:
        if weight > 0:
            samples.append([frames(f) for f in sig.split(SEPARATOR)])
            weights.append(weight)
    sampled = {
        "type": "sampled",
        "name": f"{aggregate.title} ({aggregate.value.name})",
        "unit": "nanoseconds" if aggregate.value.unit == "nanoseconds" else "none",
        "startValue": 0,
        "endValue": sum(weights),
        "samples": samples,
        "weights": weights,
    }
    return _file(aggregate.title, frames, [sampled])


FORMAT = Format(
    "speedscope",
    "application/json",
    "speedscope.json",
    request=render_request,
    aggregate=render_aggregate,
)
