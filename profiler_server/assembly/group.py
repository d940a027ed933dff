"""Assembles finished requests, of one session or of many (a storage group's): the
well-nested ones together with NumPy (`nested`), the others one at a time on the general
path that repairs (`builder`)."""

from __future__ import annotations

from collections import Counter

from profiler_server.assembly.builder import assemble
from profiler_server.assembly.forest import Forest
from profiler_server.assembly.nested import assemble_nested
from profiler_server.assembly.pending import PendingRequest


def assemble_all(pendings: list[PendingRequest], problems: Counter) -> Forest:
    """One forest of all `pendings` (in no particular order), repairs counted in `problems`."""
    nested, rest = assemble_nested(pendings, problems)
    repaired = Forest.of_trees([assemble(p.session_id, p, problems, p.main_name) for p in rest])
    if nested is None:
        return repaired
    return Forest.concat([nested, repaired]) if rest else nested
