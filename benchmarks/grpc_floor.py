"""The fleet benchmark's baseline: a server that does only what gRPC and the wire format
cost. It reads each host message of the ingest stream, decodes it and acks every batch at
once as stored, on one asyncio loop, with nothing stored, assembled or counted. The fleet
client drives it exactly as it drives the real server, so the real server's batches/s and
CPU per batch are set against this floor in the same run.

Run as `python -m benchmarks.grpc_floor --listen HOST:PORT --http HOST:PORT` (other
options of the real server are accepted and ignored); it prints the real server's ready
line and answers `GET /healthz`, so `benchmarks.server.ServerProcess` starts it (and
SIGTERM stops it)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator

import grpc

from profiler_core.wire import ingest_pb2
from profiler_server.ingest.service import SERVICE


async def _stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[ingest_pb2.ServerMessage]:
    async for raw in requests:
        message = ingest_pb2.HostMessage.FromString(raw)
        if message.WhichOneof("body") == "batch":
            yield ingest_pb2.ServerMessage(ack=ingest_pb2.Ack(stored=[message.batch.seq]))


async def _healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    await writer.drain()
    writer.close()


async def _serve(listen: str, http: str) -> None:
    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        _stream,
        request_deserializer=None,
        response_serializer=ingest_pb2.ServerMessage.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"Stream": handler}),)
    )
    host = listen.rsplit(":", 1)[0]
    port = server.add_insecure_port(listen)
    await server.start()
    http_host, http_port = http.rsplit(":", 1)
    health = await asyncio.start_server(_healthz, http_host, int(http_port))
    bound = health.sockets[0].getsockname()[1]
    print(f"ingest on {host}:{port} (gRPC), HTTP on http://{http_host}:{bound}/", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    health.close()
    await server.stop(1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--http", required=True)
    args, _ = parser.parse_known_args(argv)
    asyncio.run(_serve(args.listen, args.http))


if __name__ == "__main__":
    main()
