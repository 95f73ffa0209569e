"""A small HTTP/1.1 server on asyncio streams: one request per connection, bounded.

Bounds, each against a client that would hold the server: at most MAX_CONNECTIONS open
(more are answered 503 at once), the request head within HEAD_TIMEOUT_S (else 408) and
its size (serve/http.py), the answer written within WRITE_TIMEOUT_S. While the handler
works (a profile takes its seconds), the connection is watched: a client that hangs up
sets the handler's `gone` event, as Go's server cancels a request's context.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from qmpprof.errors import BadRequest, ListenFailed
from qmpprof.serve.http import HeadReader, Request, Response, refused, text_response

#: A request and whether its client is gone, to an answer (None: send nothing).
Handler = Callable[[Request, asyncio.Event], Awaitable[Response | None]]
Log = Callable[[str], None]
_READ_BYTES = 4096
#: After refusing a request, how long and how much more of it is read and dropped.
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024


@dataclass(frozen=True)
class Limits:
    max_connections: int = 64
    #: The whole request head must arrive within this (slow clients, slowloris).
    head_timeout_s: float = 10.0
    #: The answer must be taken within this (a client that never reads).
    write_timeout_s: float = 30.0


class HttpServer:
    """Serves `handler` on one address until closed."""

    def __init__(self, handler: Handler, log: Log, limits: Limits = Limits()) -> None:
        self._handler = handler
        self._log = log
        self.limits = limits
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the address listened on (its port, when `port` was 0).
        Raises ListenFailed."""
        try:
            self._server = await asyncio.start_server(self._connection, host, port)
        except (OSError, UnicodeError) as err:
            # asyncio rewords bind errors around the address; the errno says it plainly
            errno = err.errno if isinstance(err, OSError) else None
            reason = os.strerror(errno) if errno else str(err)
            raise ListenFailed(f"cannot listen on {host}:{port}: {reason}") from err
        address = self._server.sockets[0].getsockname()
        return str(address[0]), int(address[1])

    async def close(self, grace_s: float) -> None:
        """Stop listening, give open connections `grace_s` to finish, then cancel them."""
        if self._server is not None:
            self._server.close()
        pending = set(self._connections)
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.limits.max_connections:
            busy = text_response(503, "too many connections; try again", (("Retry-After", "1"),))
            await self._refuse(reader, writer, busy)
            await _closed(writer)
            return
        self._connections.add(task)
        try:
            await self._serve_one(reader, writer)
        finally:
            self._connections.discard(task)
            await _closed(writer)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.limits.head_timeout_s):
                request = await _read_head(reader)
        except BadRequest as error:
            await self._refuse(reader, writer, refused(error))
            return
        except TimeoutError:
            await self._refuse(
                reader, writer, text_response(408, "the request head came too slowly")
            )
            return
        except ConnectionError:
            return
        if request is None:
            return  # closed before a whole head: nothing to answer
        response = await self._handled(request, reader)
        if response is not None:
            await self._send(writer, response, head_only=request.method == "HEAD")
            self._log(f"{request.method} {request.path[:200]} {response.status}")

    async def _handled(self, request: Request, reader: asyncio.StreamReader) -> Response | None:
        """The handler's answer; None when the client left meanwhile."""
        gone = asyncio.Event()
        watcher = asyncio.create_task(_watch_hangup(reader, gone))
        try:
            response = await self._handler(request, gone)
        except Exception as err:  # a bug must cost one request, not the server
            self._log(f"internal error on {request.path[:200]}: {type(err).__name__}: {err}")
            response = text_response(500, f"internal error: {type(err).__name__}")
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        return None if gone.is_set() else response

    async def _refuse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: Response
    ) -> None:
        """Answer a request that was not read whole, then read what the client still
        sends for a moment (bounded): closing with unread bytes would reset the
        connection, and the client might lose the answer before reading it."""
        await self._send(writer, response)
        self._log(f"refused: {response.status} {response.body.decode(errors='replace').strip()}")
        with contextlib.suppress(ConnectionError, TimeoutError, OSError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER_S):
                left = LINGER_BYTES
                while left > 0 and (data := await reader.read(_READ_BYTES)):
                    left -= len(data)

    async def _send(
        self, writer: asyncio.StreamWriter, response: Response, head_only: bool = False
    ) -> None:
        """Write the answer; a client that does not take it in time is dropped."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(self.limits.write_timeout_s):
                writer.write(response.encode(head_only))
                await writer.drain()


async def _read_head(reader: asyncio.StreamReader) -> Request | None:
    """The request head; None when the client closed first. Raises BadRequest."""
    head = HeadReader()
    while True:
        data = await reader.read(_READ_BYTES)
        if not data:
            if head.started:
                raise BadRequest(400, "the connection ended inside the request head")
            return None
        request = head.feed(data)
        if request is not None:
            return request


async def _watch_hangup(reader: asyncio.StreamReader, gone: asyncio.Event) -> None:
    """Set `gone` when the client closes its side. Anything more it sends (a second,
    pipelined request) is read and dropped: every connection serves one request."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(_READ_BYTES):
            pass
    gone.set()


async def _closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(1.0):
            await writer.wait_closed()
