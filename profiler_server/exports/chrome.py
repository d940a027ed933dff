"""Chrome's Trace Event format (JSON object form), which Perfetto and chrome://tracing load:
one complete (`X`) event per call with `ts`/`dur` in microseconds, one process per request,
one thread per lane, named by `M` metadata events; `args` carry the call's time split."""

from __future__ import annotations

from profiler_server.exports.base import Format, RequestProfile, json_bytes
from profiler_server.exports.timeline import spans

PID = 1  # one request per file
NS_PER_US = 1000
ARGS = ("self_ns", "active_ns", "await_ns", "ready_ns", "suspensions", "outcome")


def _metadata(kind: str, tid: int, **args: str | int) -> dict:
    return {"ph": "M", "name": kind, "pid": PID, "tid": tid, "args": args}


def render_request(profile: RequestProfile) -> bytes:
    s = profile.summary
    events = [_metadata("process_name", 0, name=f"{s['service']} {s['method']} {s['route']}")]
    for tid, lane in enumerate(profile.lanes, start=1):
        events.append(_metadata("thread_name", tid, name=f"{lane.name} ({lane.kind})"))
        events.append(_metadata("thread_sort_index", tid, sort_index=tid))
        for span in spans(lane.root):
            node = span.node
            events.append(
                {
                    "ph": "X",
                    "name": node.function,
                    "cat": lane.kind,
                    "ts": span.start_ns / NS_PER_US,
                    "dur": (span.end_ns - span.start_ns) / NS_PER_US,
                    "pid": PID,
                    "tid": tid,
                    "args": {key: getattr(node, key) for key in ARGS},
                }
            )
    return json_bytes(
        {
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {"request": s["id"], "start": s["start"]},
        }
    )


FORMAT = Format("chrome", "application/json", "trace.json", request=render_request)
