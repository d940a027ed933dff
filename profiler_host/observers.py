"""Whether another tool watches this process's execution: then the host samples nothing.

A sampled request runs hook calls in every instrumented call. Under a tracer
(`sys.settrace`: debuggers, coverage before 3.12) or a `sys.monitoring` tool (3.12 on:
coverage's sysmon core, debuggers, profilers) the tool would see those calls and the host
would record the tool's own cost. `watched` runs at every request's start, so it is a few
C calls: `sys.gettrace()` and, from 3.12, `sys.monitoring.get_tool` for each tool id.
"""

from __future__ import annotations

import sys

_MONITORING = getattr(sys, "monitoring", None)
_TOOL_IDS = range(6)  # sys.monitoring's ids: DEBUGGER_ID 0 to OPTIMIZER_ID 5


def watched() -> bool:
    """A tracer is set, or a sys.monitoring tool id is in use."""
    if sys.gettrace() is not None:
        return True
    if _MONITORING is not None:
        get_tool = _MONITORING.get_tool
        for tool in _TOOL_IDS:
            if get_tool(tool) is not None:
                return True
    return False
