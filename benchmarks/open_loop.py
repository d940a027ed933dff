"""An open-loop HTTP/1.1 load generator for latency at a fixed rate:
`python -m benchmarks.open_loop --port P --rate R --seconds S [--warmup W] --requests JSON`.

wrk is closed-loop: a connection sends its next request only when the previous answer has
come, so a server that stalls is sent less while it stalls and its slow answers are
undercounted (coordinated omission). Here arrivals are a Poisson process of the given mean
rate from a seeded generator (every setup of a run gets the same schedule); each request
goes out as it falls due, on a free keep-alive connection, or on a new one when none is
free (the server's `Connection: close`, as gunicorn's sync worker sends, closes a
connection after its answer), in the route mix given (method, path, body), in turn.

A request's latency runs from when the client issued it (connecting, if it needed a new
connection, included) to when the kernel received the last bytes of its answer (the
socket's receive timestamps, `SO_TIMESTAMPNS`): the client sharing its core with other
processes can make it issue late or read late, and neither is charged to the server.
How late requests were issued after they fell due is reported apart (`issue_lag_us`): if
it grows, the arrival process the server saw was burstier than Poisson. Until a request
falls due the loop reads answers (epoll), and sleeps the last 1.5 ms (`time.sleep` with
1 us timer slack: epoll's timeouts are whole milliseconds); a new connection is connected
before its request is written (on loopback connect() returns with the handshake done),
since a sync worker that accepted a connection reads it until a request comes. The
garbage collector is off. With `--pid`, the CPU time the server process used (all its
threads, dead ones included, from its CPU-time clock) over the measured seconds is
reported too.

Prints one JSON object: requests measured, errors, latency quantiles in microseconds and
a histogram of them (bucket b holds latencies in [e^(b/100), e^((b+1)/100)) us, 1% wide)
so windows can be pooled.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import random
import select
import socket
import struct
import sys
import time
from collections import Counter, deque

PR_SET_TIMERSLACK = 29
SO_TIMESTAMPNS = 35  # Linux; SCM_TIMESTAMPNS has the same value
TIMESPEC = struct.Struct("qq")
DRAIN_TIMEOUT = 10.0  # s to wait for the answers still due after the last request
MAX_CONNECTIONS = 1000  # beyond this, requests wait for a free connection
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
SLEEP = 0.0015  # s: waits shorter than this are slept, longer ones spent reading answers


def cpu_clock(pid: int) -> int:
    """The clock id of process `pid`'s CPU time, all its threads, dead ones included (what
    glibc's clock_getcpuclockid returns)."""
    return ((~pid) << 3) | 2


def quantiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank quantiles (and max) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return {}
    out = {
        name: ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]
        for name, q in QUANTILES.items()
    }
    out["max"] = ordered[-1]
    return {name: round(value, 1) for name, value in out.items()}


def bucket(value_us: float) -> int:
    return math.floor(100 * math.log(max(value_us, 1.0)))


def histogram(values_us: list[float]) -> dict[str, int]:
    return {str(b): n for b, n in sorted(Counter(map(bucket, values_us)).items())}


def quantiles_of_histogram(counts: dict[int, int]) -> dict[str, float]:
    """Quantiles of (pooled) histograms: each bucket stands for its geometric middle."""
    total = sum(counts.values())
    out: dict[str, float] = {}
    for name, q in QUANTILES.items():
        rank, seen = math.ceil(q * total), 0
        for b in sorted(counts):
            seen += counts[b]
            if seen >= rank:
                out[name] = round(math.exp((b + 0.5) / 100), 1)
                break
    return out


class _Connection:
    __slots__ = ("buffer", "busy", "issued_ns", "measured", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.busy = False
        self.buffer = bytearray()
        self.issued_ns = 0
        self.measured = False


class Client:
    def __init__(self, port: int, requests: list[bytes]) -> None:
        self.port = port
        self.requests = requests
        self.next_request = 0
        self.connections: dict[int, _Connection] = {}
        self.idle: deque[_Connection] = deque()
        self.queued: deque[tuple[int, bool]] = deque()  # (issued ns, measured), no connection
        self.outstanding = 0
        self.latencies_us: list[float] = []
        self.errors: Counter[str] = Counter()
        self.opened = 0
        self.epoll = select.epoll()

    def open(self) -> _Connection:
        """A new connection, connected: on loopback the handshake is done within connect(),
        so the request can follow at once (a sync worker that accepted the connection
        reads it until the request comes)."""
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.opened += 1
        conn = _Connection(sock)
        self.connections[sock.fileno()] = conn
        self.epoll.register(sock.fileno(), select.EPOLLIN)
        return conn

    def issue(self, measured: bool) -> None:
        """A request falls due now: sent on a free connection, a new one, or (at the cap)
        the first to come free."""
        self.outstanding += 1
        issued = time.time_ns()
        if self.idle:
            self._send(self.idle.popleft(), issued, measured)
        elif len(self.connections) < MAX_CONNECTIONS:
            self._send(self.open(), issued, measured)
        else:
            self.queued.append((issued, measured))

    def _send(self, conn: _Connection, issued_ns: int, measured: bool) -> None:
        conn.busy, conn.issued_ns, conn.measured = True, issued_ns, measured
        conn.buffer.clear()
        request = self.requests[self.next_request % len(self.requests)]
        self.next_request += 1
        conn.sock.send(request)  # small: the socket buffer takes it whole

    def _free(self, conn: _Connection | None) -> None:
        """`conn` (None: a closed one's place) takes the first queued request, if any."""
        if self.queued:
            self._send(conn or self.open(), *self.queued.popleft())
        elif conn is not None:
            conn.busy = False
            self.idle.append(conn)

    def readable(self, conn: _Connection) -> None:
        try:
            data, ancillary, _, _ = conn.sock.recvmsg(65536, 64)
        except ConnectionError:
            data, ancillary = b"", []
        if not data:
            if conn.busy:
                self.errors["connection lost"] += 1
                self.outstanding -= 1
            self._close(conn)
            return
        received_ns = time.time_ns()
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                seconds, nanoseconds = TIMESPEC.unpack(raw[: TIMESPEC.size])
                received_ns = seconds * 1_000_000_000 + nanoseconds
        if not conn.busy:
            return
        conn.buffer += data
        end = conn.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(conn.buffer[:end]).lower()
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if len(conn.buffer) < end + 4 + length:
            return
        self.outstanding -= 1
        status = int(head.split(b" ", 2)[1])
        if status >= 400:
            self.errors[f"status {status}"] += 1
        elif conn.measured:
            self.latencies_us.append((received_ns - conn.issued_ns) / 1000)
        if b"\r\nconnection: close" in head:
            self._close(conn)
            self._free(None)
        else:
            self._free(conn)

    def _close(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        del self.connections[conn.sock.fileno()]
        self.epoll.unregister(conn.sock.fileno())
        conn.sock.close()

    def poll(self, timeout: float = 0.0) -> None:
        """Handles the connections ready within `timeout` s (epoll: whole milliseconds)."""
        for fd, _ in self.epoll.poll(timeout):
            conn = self.connections.get(fd)
            if conn is not None:
                self.readable(conn)

    def wait_until(self, when: float) -> None:
        """Reads answers while waiting for monotonic time `when`; the last stretch (under
        `SLEEP` s) is slept, to the microsecond."""
        while True:
            left = when - time.monotonic()
            if left <= SLEEP:
                break
            self.poll(left - SLEEP)
        self.poll()
        left = when - time.monotonic()
        if left > 0:
            time.sleep(left)


def drive(args: argparse.Namespace, requests: list[bytes]) -> dict:
    rng = random.Random(args.seed)
    client = Client(args.port, requests)
    for _ in range(args.connections):  # a pool ready before the first request
        client.idle.append(client.open())
    start = time.monotonic() + 0.2
    measure_from = start + args.warmup
    stop = measure_from + args.seconds
    clock = cpu_clock(args.pid) if args.pid else None
    cpu: list[float] = []
    lags_us: list[float] = []
    due, counted = start, 0
    while due < stop:
        now = time.monotonic()
        while due <= now and due < stop:
            measured = due >= measure_from
            if measured:
                if clock is not None and not cpu:
                    cpu.append(time.clock_gettime(clock))
                counted += 1
                lags_us.append((now - due) * 1e6)
            client.issue(measured)
            due += rng.expovariate(args.rate)
        client.wait_until(min(due, stop))
    if clock is not None:
        cpu.append(time.clock_gettime(clock))
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while client.outstanding and time.monotonic() < deadline:
        client.poll(0.01)
    if client.outstanding:
        client.errors["no answer"] += client.outstanding
    out = {
        "requests": counted,
        "answered": len(client.latencies_us),
        "errors": dict(client.errors),
        "rate": round(counted / args.seconds, 1),
        "connections_opened": client.opened,
        "latency_us": quantiles(client.latencies_us),
        "issue_lag_us": quantiles(lags_us),
        "histogram": histogram(client.latencies_us),
    }
    if len(cpu) == 2 and counted:
        out["server_cpu_seconds"] = cpu[1] - cpu[0]
        out["server_cpu_per_request"] = (cpu[1] - cpu[0]) / counted
    return out


def raw_requests(mix: list[list], port: int) -> list[bytes]:
    out = []
    for method, path, body in mix:
        payload = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        out.append(head.encode() + b"\r\n" + payload)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.open_loop")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="mean requests per second")
    parser.add_argument("--seconds", type=float, required=True, help="measured")
    parser.add_argument("--warmup", type=float, default=1.0, help="sent, not measured")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--connections", type=int, default=4, help="opened before the start")
    parser.add_argument("--pid", type=int, default=0, help="server process to read CPU of")
    parser.add_argument("--requests", required=True, help="JSON list of [method, path, body]")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    gc.disable()
    result = drive(args, raw_requests(json.loads(args.requests), args.port))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
