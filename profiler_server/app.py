"""Wires the server together: storage, ingest worker, gRPC (ingest + health), HTTP."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import time

import grpc
import uvicorn
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from profiler_server.access.http import HttpAccess
from profiler_server.access.policy import AccessPolicy
from profiler_server.api.http import build_app
from profiler_server.exports.pyroscope import PyroscopeExporter
from profiler_server.ingest.service import SERVICE, IngestService
from profiler_server.metrics.health import ServerHealth
from profiler_server.metrics.profiles import ProfileMetrics
from profiler_server.pipeline import Pipeline
from profiler_server.settings import Settings
from profiler_server.storage import migrations
from profiler_server.storage.engine import open_engine, redacted

log = logging.getLogger("profiler_server")

# Large enough for grpc to hand us oversized messages, so we can count and explain them.
GRPC_RECEIVE_SLACK = 4
# At stop, HTTP requests still running get this long; so do TLS connections waiting for
# their client's close_notify, which asyncio would otherwise wait 30 s for.
HTTP_GRACE = 5
# Container objects allocated (net of those freed) before the cyclic GC scans the youngest
# generation; CPython's default is 700. Under a fleet, the objects of the batches in flight
# (a thousand streams' messages, futures and queued items) outlive a 700-object window, so
# each young collection promoted them and the older generations filled with what was about
# to die: collections took a sixth of the server's CPU and paused it for ~60 ms each. The
# cost is at most this many more objects' worth of cyclic garbage waiting to be freed.
GC_YOUNG_THRESHOLD = 10_000
# How long a thread holds the GIL before one waiting for it gets it (CPython's default is
# 5 ms). The storer and the event loop wait on I/O, then for the GIL, which the worker,
# busy in Python, keeps for a whole interval: at 5 ms, a fleet's storer waited longer for
# the GIL after each of a group's round trips to PostgreSQL than for PostgreSQL itself.
SWITCH_INTERVAL = 0.001


def tune_interpreter() -> None:
    """The server's process, once it is built. Everything built so far lives as long as
    the server: the cyclic GC does not rescan it (its full collections showed as latency
    spikes in the API), and scans what is new less often (GC_YOUNG_THRESHOLD); threads
    waiting for the GIL get it sooner (SWITCH_INTERVAL)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    sys.setswitchinterval(SWITCH_INTERVAL)


class ProfilingServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.access = AccessPolicy.from_settings(settings)
        self.engine = open_engine(settings.db)
        self.registry = CollectorRegistry(auto_describe=True)
        self.health = ServerHealth(self.registry, settings.max_services)
        self.profiles = ProfileMetrics(
            self.registry,
            settings.top_k,
            settings.top_functions,
            settings.max_routes,
            self.health.services,
        )
        self.pyroscope = (
            PyroscopeExporter(settings.pyroscope_url, settings.pyroscope_interval, self.registry)
            if settings.pyroscope_url
            else None
        )
        self.pipeline = Pipeline(
            self.engine,
            settings,
            self.health,
            self.profiles,
            listeners=[self.pyroscope.record] if self.pyroscope else [],
        )
        self.grpc_port = 0
        self.http_port = 0
        self._grpc: grpc.aio.Server | None = None
        self._ingest: IngestService | None = None
        self._health = health.aio.HealthServicer()
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task | None = None
        self._ready = False

    async def start(self) -> None:
        found = await asyncio.to_thread(migrations.upgrade, self.engine)
        log.info(
            "database %s (schema %d -> %d)", redacted(self.settings.db), found, migrations.LATEST
        )
        for exposed in self.access.exposed:
            log.warning("--insecure: %s", exposed)
        self.pipeline.start()
        if self.pyroscope is not None:
            self.pyroscope.start()
        limit = self.settings.max_message_bytes
        self._grpc = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit * GRPC_RECEIVE_SLACK),
                ("grpc.so_reuseport", 0),
            ]
        )
        self._ingest = IngestService(self.pipeline, self.health, limit, self.access.ingest_tokens)
        self._grpc.add_generic_rpc_handlers([self._ingest.handler()])
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        credentials = self.access.grpc_credentials()
        self.grpc_port = (
            self._grpc.add_secure_port(self.settings.listen, credentials)
            if credentials is not None
            else self._grpc.add_insecure_port(self.settings.listen)
        )
        if self.grpc_port == 0:
            raise SystemExit(f"cannot listen for gRPC on {self.settings.listen}")
        await self._grpc.start()
        host, _, port = self.settings.http.rpartition(":")
        app = HttpAccess(
            build_app(self.engine, self.registry, self.health, lambda: self._ready),
            self.access.allowed_hosts,
            self.access.read_token,
            self.health.denied,
        )
        config = uvicorn.Config(
            app,
            host=host.strip("[]"),
            port=int(port),
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=HTTP_GRACE,
            **self.access.uvicorn_tls(),
        )
        self._http = uvicorn.Server(config)
        self._http.install_signal_handlers = lambda: None  # our run() owns the signals
        self._http_task = asyncio.create_task(self._http.serve())
        deadline = time.monotonic() + 10
        while not self._http.started:
            if self._http_task.done() or time.monotonic() > deadline:
                raise SystemExit(f"cannot serve HTTP on {self.settings.http}")
            await asyncio.sleep(0.01)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]
        for name in ("", SERVICE):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        tune_interpreter()
        self._ready = True
        log.info(
            "ingest on %s:%d (gRPC%s), HTTP on %s://%s:%d/",
            self.settings.listen.rpartition(":")[0],
            self.grpc_port,
            " over TLS" if self.access.tls else "",
            "https" if self.access.tls else "http",
            host,
            self.http_port,
        )

    async def stop(self, grace: float = 10.0) -> None:
        """Drains streams (their batches stored and acked), flushes storage, stops serving."""
        self._ready = False
        for name in ("", SERVICE):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._ingest is not None:
            self._ingest.drain()
            deadline = time.monotonic() + grace
            while self.health.open_streams._value.get() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await asyncio.to_thread(self.pipeline.stop)
        if self.pyroscope is not None:
            await asyncio.to_thread(self.pyroscope.stop)
        if self._grpc is not None:
            await self._grpc.stop(1.0)
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await self._http_task
        self.engine.dispose()

    async def run(self) -> None:
        """Serves until SIGTERM/SIGINT, then drains and returns."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("stopping: draining streams and flushing storage")
        await self.stop()
        log.info("stopped")
