"""`serve`'s HTTP server on real loopback sockets, with a handler of the test's own: the
bounds against clients that would hold it (slow heads, too many connections, endless
headers) and the hang-up that ends a request's work."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from qmpprof.serve.http import Request, Response
from qmpprof.serve.server import HttpServer, Limits

GET = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"
Handler = Callable[[Request, asyncio.Event], Awaitable[Response | None]]


async def answer_ok(request: Request, gone: asyncio.Event) -> Response:
    return Response(200, request.path.encode())


@asynccontextmanager
async def server(handler: Handler, limits: Limits, log: list[str]) -> AsyncIterator[int]:
    served = HttpServer(handler, log.append, limits)
    _, port = await served.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await served.close(grace_s=5)


async def exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return answer


def test_a_request_and_its_answer() -> None:
    async def run() -> bytes:
        async with server(answer_ok, Limits(), []) as port:
            return await exchange(port, GET)

    answer = asyncio.run(run())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n/x")


def test_a_slow_head_gets_408() -> None:
    async def run() -> bytes:
        async with server(answer_ok, Limits(head_timeout_s=0.2), []) as port:
            return await exchange(port, b"GET /x HTTP/1.1\r\n")  # and nothing more

    assert asyncio.run(run()).startswith(b"HTTP/1.1 408 ")


def test_connections_over_the_limit_get_503() -> None:
    async def run() -> tuple[bytes, bytes]:
        started = asyncio.Event()
        release = asyncio.Event()

        async def hold(request: Request, gone: asyncio.Event) -> Response:
            started.set()
            await release.wait()
            return Response(200, b"held")

        async with server(hold, Limits(max_connections=1), []) as port:
            first = asyncio.create_task(exchange(port, GET))
            await started.wait()
            refused = await exchange(port, GET)
            release.set()
            return await first, refused

    first, refused = asyncio.run(run())
    assert first.endswith(b"held") and refused.startswith(b"HTTP/1.1 503 ")


def test_endless_headers_get_431_and_the_answer_arrives() -> None:
    async def run() -> bytes:
        async with server(answer_ok, Limits(), []) as port:
            header = b"X-A: " + b"a" * 100 + b"\r\n"
            return await exchange(port, b"GET / HTTP/1.1\r\nHost: t\r\n" + header * 400 + b"\r\n")

    assert asyncio.run(run()).startswith(b"HTTP/1.1 431 ")


def test_a_client_that_hangs_up_ends_the_work_and_gets_nothing() -> None:
    async def run() -> list[str]:
        working = asyncio.Event()
        ended = asyncio.Event()
        log: list[str] = []

        async def until_gone(request: Request, gone: asyncio.Event) -> Response:
            working.set()
            await gone.wait()
            ended.set()
            return Response(200, b"late")

        async with server(until_gone, Limits(), log) as port:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(GET)
            await working.wait()
            writer.close()
            await asyncio.wait_for(ended.wait(), 30)
        return log

    assert asyncio.run(run()) == []  # nothing was answered, so nothing logged


def test_a_handler_that_fails_costs_one_request() -> None:
    async def run() -> tuple[bytes, bytes, list[str]]:
        log: list[str] = []

        async def broken(request: Request, gone: asyncio.Event) -> Response:
            if request.path == "/x":
                raise RuntimeError("bug")
            return Response(200, b"fine")

        async with server(broken, Limits(), log) as port:
            first = await exchange(port, GET)
            second = await exchange(port, b"GET /y HTTP/1.0\r\n\r\n")
        return first, second, log

    first, second, log = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 500 ") and first.endswith(b"internal error: RuntimeError\n")
    assert second.endswith(b"fine")
    assert log[0] == "internal error on /x: RuntimeError: bug"
