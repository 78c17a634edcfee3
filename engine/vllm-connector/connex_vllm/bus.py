"""The connector's NATS connection to its connexd, on an asyncio event loop of its own thread.

nats-py is asyncio-only and vLLM's scheduler and workers are synchronous, so every connector process owns one
``Bus``: a daemon thread runs the loop, hooks hand it coroutines and get ``concurrent.futures.Future`` back at
once (``submit``/``request``) or, only where vLLM's contract needs the answer before the hook returns, wait with
a deadline (``request_sync``). Notice handlers run on the loop thread and must only touch thread-safe state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import nats
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from . import subjects_gen
from .codes import CODE_FORBIDDEN, CODE_INTERNAL, CODE_PEER_UNAVAILABLE, CODE_TIMEOUT

log = logging.getLogger("connex_vllm")

M = TypeVar("M", bound=Message)
T = TypeVar("T")

PREFIX = subjects_gen.PREFIX
_HDR_CODE = "Nats-Service-Error-Code"
_HDR_ERROR = "Nats-Service-Error"


class ConnexError(Exception):
    """A subject-API call failed: ``code`` is the stable number of the API's error table (``codes``). ``answered``:
    connexd sent this error; False when the call got no answer (no reply in time, no responder, the connection)."""

    def __init__(self, code: int, message: str, answered: bool = True) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.answered = answered


# Endpoints served only in the member scope (members and admins call them); every other endpoint is also
# served in each engine's scope, where connexd takes the calling engine from the subject. Generated from
# api/subjects.go (subjects_gen.py), so that it cannot drift from what connexd serves.
MEMBER_ONLY = subjects_gen.MEMBER_ONLY


def subject(member: str, endpoint: str, engine: str | None = None) -> str:
    """The subject of ``endpoint`` on ``member``: in ``engine``'s scope (connex.v1.<member>.e.<engine>.<endpoint>,
    the only subjects an engine's credentials may publish on) when given, else in the member scope
    (connex.v1.<member>.<endpoint>)."""
    if engine and endpoint not in MEMBER_ONLY:
        return f"{PREFIX}.{member}.e.{engine}.{endpoint}"
    return f"{PREFIX}.{member}.{endpoint}"


def inbox_prefix(member: str, engine: str | None) -> str:
    """The reply-subject prefix of an engine's connection on ``member``: its credentials may subscribe to no other
    inbox (the member is part of it, so an engine of the same id on another member reads none of its replies)."""
    return f"_INBOX.e.{member}.{engine}" if engine else "_INBOX"


def engine_subject(member: str, engine_id: str, notice: str) -> str:
    """The subject of the notices of engine ``engine_id`` on ``member``: blocks.freed, pull.done, request.fenced,
    request.resume, hold.lost (">" for all of them)."""
    return f"{PREFIX}.engine.{member}.{engine_id}.{notice}"


class Bus:
    """One NATS connection on a private event-loop thread; safe to use from any thread."""

    def __init__(
        self,
        url: str,
        member: str,
        name: str,
        connect_timeout_s: float,
        *,
        engine: str | None = None,
        creds: str = "",
        tls_ca: str = "",
    ) -> None:
        """Connects to NATS at ``url`` for calls to connexd ``member``. With ``engine``, calls go in that engine's
        scope and replies to its own inbox; ``creds`` is a NATS credentials file (`connexd auth creds`), ``tls_ca``
        the CA that verifies the server."""
        self.member = member
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"connex-nats-{name}", daemon=True)
        self._thread.start()
        self._nc: NATS | None = None
        self._closed = False
        self._tasks: list[concurrent.futures.Future[None]] = []
        # Observer of every call's round trip (endpoint, seconds), on the loop thread: metrics and benchmarks.
        self.on_call: Callable[[str, float], None] | None = None

        async def connect() -> NATS:
            opts: dict[str, Any] = {}
            if creds:
                opts["user_credentials"] = creds
            if tls_ca:
                ctx = ssl.create_default_context(cafile=tls_ca)
                opts["tls"] = ctx
            return await nats.connect(
                url,
                name=name,
                connect_timeout=connect_timeout_s,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.2,
                allow_reconnect=True,
                inbox_prefix=inbox_prefix(member, engine),
                **opts,
            )

        try:
            self._nc = self.run(connect(), connect_timeout_s + 1.0)
        except Exception as e:
            self._stop_loop()
            raise ConnexError(CODE_PEER_UNAVAILABLE, f"connect to NATS at {url} for connexd {member}: {e!r}") from e

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules coro on the loop thread and returns at once."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Runs coro on the loop thread and waits for it (start-up, shutdown and contract-bound hooks only)."""
        return self.submit(coro).result(timeout_s)

    async def call(self, endpoint: str, msg: Message, reply: type[M], timeout_s: float) -> M:
        """One request/reply on ``endpoint`` (protobuf; ``subject``); API errors raise ConnexError."""
        assert self._nc is not None
        subj = subject(self.member, endpoint, self.engine)
        t0 = time.perf_counter()
        try:
            # Protobuf needs no content type (a call without one is protobuf):
            # no header to build here, on the engine's loop thread, nor for
            # connexd to parse.
            r = await self._nc.request(subj, msg.SerializeToString(), timeout=timeout_s)
        except NoRespondersError as e:
            raise ConnexError(CODE_PEER_UNAVAILABLE, f"{subj}: no connexd answers", answered=False) from e
        except (NatsTimeoutError, asyncio.TimeoutError) as e:
            le = self._nc.last_error
            if le is not None and "permissions violation" in str(le).lower() and subj in str(le):
                msg = f"{subj}: the NATS server refused it to these credentials: {le}"
                raise ConnexError(CODE_FORBIDDEN, msg) from e
            raise ConnexError(CODE_TIMEOUT, f"{subj}: no reply within {timeout_s}s", answered=False) from e
        except (NatsError, OSError) as e:
            # The connection closed, its outbound buffer filled while it
            # reconnects (a connexd restart), a payload over the limit: the
            # callers handle ConnexError alone, and none of these may escape
            # into vLLM's step loop.
            raise ConnexError(CODE_PEER_UNAVAILABLE, f"{subj}: {type(e).__name__}: {e}", answered=False) from e
        if self.on_call is not None:
            self.on_call(endpoint, time.perf_counter() - t0)
        hdrs = r.headers or {}
        if _HDR_CODE in hdrs:
            code = int(hdrs.get(_HDR_CODE) or CODE_INTERNAL)
            raise ConnexError(code, f"{subj}: {hdrs.get(_HDR_ERROR, '')}")
        out = reply()
        try:
            out.ParseFromString(r.data)
        except DecodeError as e:
            raise ConnexError(CODE_INTERNAL, f"{subj}: undecodable {reply.__name__} reply: {e}") from e
        return out

    def request(self, endpoint: str, msg: Message, reply: type[M], timeout_s: float) -> concurrent.futures.Future[M]:
        """``call`` from any thread without waiting: the future completes on the loop thread."""
        return self.submit(self.call(endpoint, msg, reply, timeout_s))

    def request_sync(self, endpoint: str, msg: Message, reply: type[M], timeout_s: float) -> M:
        """``call`` from any thread, waiting at most timeout_s (plus a margin for the hand-off)."""
        return self.request(endpoint, msg, reply, timeout_s).result(timeout_s + 1.0)

    def subscribe(self, subj: str, handler: Callable[[bytes], None], timeout_s: float = 5.0) -> None:
        """Subscribes handler (run on the loop thread) to subj and flushes, so no notice sent after it is missed."""

        async def sub() -> None:
            assert self._nc is not None

            async def cb(m: Any) -> None:
                try:
                    handler(m.data)
                except Exception:  # a bad notice must not kill the subscription
                    log.exception("connex: notice handler for %s failed", subj)

            await self._nc.subscribe(subj, cb=cb)
            await self._nc.flush(timeout=timeout_s)

        self.run(sub(), timeout_s + 1.0)

    def subscribe_async(
        self, subj: str, handler: Callable[[str, bytes, dict[str, str]], Awaitable[None]], timeout_s: float = 5.0
    ) -> None:
        """Like ``subscribe`` for a coroutine handler(subject, data, headers) run on the loop thread; messages of
        the subscription are handled one at a time, in order (the handler may await calls)."""

        async def sub() -> None:
            assert self._nc is not None

            async def cb(m: Any) -> None:
                try:
                    await handler(m.subject, m.data, dict(m.headers or {}))
                except Exception:  # a bad notice must not kill the subscription
                    log.exception("connex: notice handler for %s failed", subj)

            await self._nc.subscribe(subj, cb=cb)
            await self._nc.flush(timeout=timeout_s)

        self.run(sub(), timeout_s + 1.0)

    def every(self, seconds: Callable[[], float], fn: Callable[[], Awaitable[float | None]]) -> None:
        """Runs fn on the loop every seconds() until close; fn may return the next interval."""

        async def loop() -> None:
            wait = seconds()
            while not self._closed:
                await asyncio.sleep(wait)
                if self._closed:
                    return
                try:
                    nxt = await fn()
                except Exception:
                    log.exception("connex: periodic task failed; retrying")
                    nxt = None
                wait = nxt if nxt else seconds()

        self._tasks.append(self.submit(loop()))

    def close(self, timeout_s: float = 5.0) -> None:
        """Drains the connection and stops the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        nc = self._nc
        if nc is not None:
            try:
                self.run(nc.close(), timeout_s)
            except Exception as e:
                log.warning("connex: closing NATS connection: %r", e)
        self._stop_loop()

    def _stop_loop(self) -> None:
        async def cancel_all() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.wait(rest, timeout=1.0) if rest else None

        try:
            self.run(cancel_all(), 2.0)
        except Exception as e:
            log.debug("connex: cancelling bus tasks: %r", e)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
