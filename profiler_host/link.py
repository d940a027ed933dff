"""The app's end of its relay process (`relay.py`), which holds the gRPC stream: started by
exec as the transport's thread starts (or at the next stream, after one died), it lives as
long as the app's end of their socket pair (a forked child closes its copy at once and
starts a relay of its own), and is replaced when it dies or stops answering. Only the
transport's threads touch it; no thread here polls: the reader blocks on the socket until
the relay writes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from profiler_core.wire import ingest_pb2
from profiler_host import relay_frames as frames
from profiler_host.security import ChannelSecurity

log = logging.getLogger("profiler_host")

# the relay sees neither PYTHON* variables nor site (so no sitecustomize: it is never
# profiled itself); it imports from the app's own path, with this package's root first
_BOOT = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from profiler_host.relay import main; main()"
)
_ROOT = str(Path(__file__).resolve().parent.parent)
EXITED = "the relay process exited"
_LINKS: weakref.WeakSet[Link] = weakref.WeakSet()


class StreamClosed(Exception):
    """How a stream ended other than by the server's clean end: the gRPC status code's
    name, its details, and the drop reason when the server refused this host ("" when
    a later try may succeed)."""

    def __init__(self, code: str, details: str, refusal: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code, self.details, self.refusal = code, details, refusal


class Link:
    def __init__(self, server: str, security: ChannelSecurity) -> None:
        self._settings = json.dumps(
            {"server": server, "security": dataclasses.asdict(security)}
        ).encode()
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._writing = threading.Lock()
        self._warned = False
        _LINKS.add(self)

    @property
    def relay_pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def prepare(self) -> None:
        """Starts the relay if none runs (it boots beside the app, in about 0.15 s of CPU).
        Raises OSError if it cannot start."""
        if self._process is None or self._process.poll() is not None:
            self.reset()
            self._start()

    def stream(self, messages: Iterator[bytes]) -> Stream:
        """Opens a stream through the relay (started first if none runs): a thread of its
        own writes `messages` to it until they end. Raises OSError if no relay can start."""
        self.prepare()
        self.send(frames.OPEN)
        return Stream(self, messages)

    def _start(self) -> None:
        python = sys.executable
        if not python:
            raise self._cannot("the interpreter does not know its executable")
        paths = [_ROOT, *(os.path.abspath(p or os.curdir) for p in sys.path)]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            process = subprocess.Popen(
                [python, "-I", "-S", "-c", _BOOT, json.dumps(paths)],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # the terminal's signals are the app's to act on
            )
        except OSError as exc:
            ours.close()
            raise self._cannot(str(exc)) from exc
        finally:
            theirs.close()
        self._sock, self._process = ours, process
        self.send(frames.SETTINGS, self._settings)

    def _cannot(self, why: str) -> OSError:
        if not self._warned:
            self._warned = True
            log.warning("request-profiler: no relay process (%s): nothing is sent", why)
        return OSError(why)

    def send(self, kind: int, body: bytes = b"") -> None:
        sock = self._sock
        if sock is None:
            raise OSError(EXITED)
        with self._writing:
            frames.send(sock, kind, body)

    def receive(self) -> tuple[int, bytes] | None:
        sock = self._sock
        if sock is None:
            return None
        try:
            return frames.receive(sock)
        except (OSError, ValueError):
            return None

    def reset(self) -> None:
        """Ends the relay, if any: a blocked reader sees the socket's end at once."""
        sock, process = self._sock, self._process
        self._sock = self._process = None
        if sock is not None:
            _shut(sock)
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()

    def forget(self) -> None:
        """In a forked child: close the copy of the parent's socket, never touching the
        parent's relay, so that it still ends when the parent does."""
        sock = self._sock
        self._sock = self._process = None
        self._writing = threading.Lock()
        if sock is not None:
            sock.close()


class Stream:
    """One stream through the relay. Iterating reads the server's replies until its clean
    end; any other end raises StreamClosed."""

    def __init__(self, link: Link, messages: Iterator[bytes]) -> None:
        self._link = link
        self._writer = threading.Thread(
            target=self._write, args=(messages,), name="request-profiler-link", daemon=True
        )
        self._writer.start()

    def _write(self, messages: Iterator[bytes]) -> None:
        try:
            for message in messages:
                self._link.send(frames.MESSAGE, message)
            self._link.send(frames.END)
        except OSError:  # the relay is gone: the reader sees the socket's end
            pass

    def __iter__(self) -> Iterator[ingest_pb2.ServerMessage]:
        while True:
            frame = self._link.receive()
            if frame is None:
                raise StreamClosed("UNAVAILABLE", EXITED, "")
            kind, body = frame
            if kind == frames.REPLY:
                yield ingest_pb2.ServerMessage.FromString(body)
            elif kind == frames.CLOSED:
                end = json.loads(body)
                if end["code"] == "OK":
                    return
                raise StreamClosed(end["code"], end["details"], end["refusal"])

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            self._link.send(frames.CANCEL)

    def finish(self, timeout: float) -> bool:
        """Waits for the writer (its messages have ended); False if it is still stuck."""
        self._writer.join(timeout)
        return not self._writer.is_alive()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _forget_all() -> None:
    for link in list(_LINKS):
        link.forget()


os.register_at_fork(after_in_child=_forget_all)
