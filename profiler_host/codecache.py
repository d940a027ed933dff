"""A disk cache of rewritten module code, so a warm start costs little more than a plain one.

Rewriting costs about 1 ms per function; loading the result back costs microseconds.
Instrumented code cannot be marshalled as it is (its constants hold the hook functions and
the gate's slot, switched in place), and function ids differ between processes. So the
cache stores the module's rewritten code with every hook constant and the gate's slot
replaced by a marker string and, per code object in a fixed walk order, the index of its
function-id constant. Loading swaps the hooks back in and registers fresh ids. Entries
are keyed by the original code's marshalled bytes, the full Python version (`sys.version`)
and the rewriter's own sources (its layouts included), so any change to either misses; a
module whose layout cannot be recorded exactly is simply not cached. Every failure here
means a miss.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import marshal
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from types import CodeType

from profiler_host import codetables, gates, layouts, rewriter

log = logging.getLogger("profiler_host")

_MARKER = "\x00request-profiler-hook:"
_FORMAT = 1


def _rewriter_fingerprint() -> bytes:
    """The interpreter's full version and the sources of everything that writes rewritten
    code: the rewriter, the location encoder and every version's layout."""
    modules = [Path(inspect.getfile(m)) for m in (rewriter, codetables)]
    modules += sorted(Path(inspect.getfile(layouts)).parent.glob("*.py"))
    source = b"".join(path.read_bytes() for path in modules)
    return hashlib.sha256(source + sys.version.encode() + bytes([_FORMAT])).digest()


class CodeCache:
    def __init__(self, directory: Path, hooks: rewriter.Hooks) -> None:
        self.directory = directory
        self._hook_of = {_MARKER + f.name: getattr(hooks, f.name) for f in fields(hooks)}
        self._marker_of = {id(hook): marker for marker, hook in self._hook_of.items()}
        self._gate_marker = self._marker_of[id(hooks.gate)]
        self._fingerprint = _rewriter_fingerprint()
        self.hits = 0
        self.misses = 0

    def _path(self, module: str, original: CodeType) -> Path:
        # version 2: no back-references, whose flags follow refcounts, so equal code, equal key
        digest = hashlib.sha256(self._fingerprint + marshal.dumps(original, 2)).hexdigest()
        return self.directory / f"{module}.{digest[:40]}.rpc"

    def load(
        self, module: str, original: CodeType, register: Callable[[CodeType], int]
    ) -> tuple[CodeType, list[tuple[CodeType, CodeType]]] | None:
        """The instrumented module code and (original, instrumented) pairs, or None."""
        try:
            manifest, stored = marshal.loads(self._path(module, original).read_bytes())
            pairs: list[tuple[CodeType, CodeType]] = []
            code = self._revive(original, stored, iter(manifest), register, pairs)
        except (OSError, ValueError, EOFError, TypeError, StopIteration, IndexError):
            self.misses += 1
            return None
        self.hits += 1
        return code, pairs

    def _revive(
        self,
        original: CodeType,
        stored: CodeType,
        manifest: Iterator[int],
        register: Callable[[CodeType], int],
        pairs: list[tuple[CodeType, CodeType]],
    ) -> CodeType:
        fid_at = next(manifest)
        consts = list(stored.co_consts)
        for i, const in enumerate(consts):
            if isinstance(const, CodeType):
                consts[i] = self._revive(original.co_consts[i], const, manifest, register, pairs)
            elif isinstance(const, str) and const.startswith(_MARKER):
                consts[i] = self._hook_of[const]
        if fid_at >= 0:
            consts[fid_at] = rewriter.FunctionId(register(original))
        code = stored.replace(co_consts=tuple(consts))
        gates.track(code)
        pairs.append((original, code))
        return code

    def store(self, module: str, original: CodeType, instrumented: CodeType) -> None:
        manifest: list[int] = []
        try:
            portable = self._portable(original, instrumented, manifest)
            payload = marshal.dumps((tuple(manifest), portable))
        except (ValueError, TypeError) as exc:
            log.debug("request-profiler: %s not cached: %s", module, exc)
            return
        path = self._path(module, original)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, delete=False) as out:
                out.write(payload)
            os.replace(out.name, path)  # atomic: concurrent workers never read half a file
        except OSError as exc:
            log.debug("request-profiler: cannot write the code cache: %s", exc)

    def _portable(self, original: CodeType, code: CodeType, manifest: list[int]) -> CodeType:
        """`code` with markers for hooks; appends its function-id index (or -1)."""
        consts = list(code.co_consts)
        rewritten = any(id(const) in self._marker_of for const in consts)
        added = range(len(original.co_consts), len(consts))
        ids = [i for i in added if type(consts[i]) is rewriter.FunctionId]
        if rewritten and len(ids) != 1:
            raise ValueError("function id constant not found unambiguously")
        manifest.append(ids[0] if rewritten else -1)
        for i, const in enumerate(consts):
            if isinstance(const, CodeType):
                consts[i] = self._portable(original.co_consts[i], const, manifest)
            elif id(const) in self._marker_of:
                consts[i] = self._marker_of[id(const)]
            elif type(const) is rewriter.FunctionId:
                consts[i] = 0  # a fresh id goes here when loaded
        gate = gates.index(code) if rewritten else None
        if gate is not None:  # the slot holds None while the gates are closed
            consts[gate] = self._gate_marker
        return code.replace(co_consts=tuple(consts))


def default_directory() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "request-profiler"
