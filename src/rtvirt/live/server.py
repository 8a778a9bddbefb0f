"""The live view's HTTP server: the page, its data as it changes (Server-Sent Events), one configuration's
history, and ``/metrics`` for Prometheus; read-only, and local unless told otherwise (docs/live.md).

Tornado serves it (asyncio; a connection that waits for the next update costs no thread). Everything that
reads files or the store runs on one worker thread, in turn: a refresh once a second (the source catches up with
what campaigns wrote and builds the page's document once, for every open page), a scrape, a history question.

Safety: GET only; every answer carries a Content-Security-Policy that lets the page run its own script file and
nothing inline, and the page writes every string from runs, guests and targets as text, never as markup. A
listening address other than loopback needs a token (from a file or the environment, never the command line);
with a token every request must carry it (``Authorization: Bearer``, or the cookie a first ``/?token=`` visit
sets); without one, a request must name this server as its Host (no DNS rebinding from a web page).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

import tornado.httpserver
import tornado.iostream
import tornado.netutil
import tornado.web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..errors import InputError, RtvirtError
from ..results.history import METRICS, trend, trend_of
from ..results.verdicts import RequirementClass
from .access import Listen
from .metrics import CampaignMetrics, LiveCollector, RunMetrics

if TYPE_CHECKING:
    from ..stores import RunStore

__all__ = ["LiveSource", "serve", "MAX_STREAMS"]

MAX_STREAMS = 32  # open pages at once
KEEPALIVE_S = 15.0
COOKIE = "rtvirt_live"
MAX_QUERY = 500  # characters of a configuration name asked for
VOLATILE = ("generated", "built_s")  # a document's time stamps: a change of these alone is not sent
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class LiveSource(Protocol):
    """What the server shows: a results directory (rtvirt.live.local) or a shared store (rtvirt.live.shared)."""

    label: str
    classes: list[RequirementClass]

    def refresh(self) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def metrics(self) -> tuple[list[RunMetrics], list[CampaignMetrics]]: ...

    @property
    def store(self) -> RunStore: ...

    def configurations(self) -> list[tuple[str, int]]: ...

    def close(self) -> None: ...


def _finite(value: Any) -> Any:
    """JSON the browser parses: NaN and infinities (statistics of no samples) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json(document: Any) -> bytes:
    return json.dumps(_finite(document), separators=(",", ":"), default=str).encode()


class Live:
    """The server's state: the source, the latest page document and who waits for the next one."""

    def __init__(self, source: LiveSource, token: str | None, listen: Listen, refresh_s: float) -> None:
        self.source = source
        self.token = token
        self.listen = listen
        self.refresh_s = refresh_s
        self.allowed_hosts: set[str] = set()
        self.latest = _json({"source": source.label, "machines": []})
        self._content = b""
        self.version = 0
        self.streams = 0
        self._changed = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rtvirt-live")
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LiveCollector(source.metrics))
        self._configurations: tuple[float, bytes] | None = None

    async def call(self, work: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._worker, work, *args)

    def _build(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            self.source.refresh()
            document = self.source.snapshot()
        except RtvirtError as exc:  # the store went away: said on the page, asked again next time
            document = {**json.loads(self.latest), "errors": [str(exc)[:300]]}
        document["built_s"] = round(time.perf_counter() - started, 4)
        return document

    async def refresh(self) -> None:
        """A new document; open pages are sent it only when more than its time stamps changed."""
        document = await self.call(self._build)
        content = _json({key: value for key, value in document.items() if key not in VOLATILE})
        self.latest = _json(document)
        if content != self._content:
            self._content, self.version = content, self.version + 1
            self._changed.set()
            self._changed = asyncio.Event()

    async def refresh_forever(self) -> None:
        while True:
            started = time.monotonic()
            await self.refresh()
            await asyncio.sleep(max(0.05, self.refresh_s - (time.monotonic() - started)))

    async def next_change(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    def trend(self, config: str, metric: str) -> bytes:
        try:
            found = trend(self.source.store, config, metric, classes=self.source.classes)
        except InputError:  # nothing stored yet (a results directory without runs/)
            found = trend_of([], config, metric)  # ValueError for a metric that is none
        return _json(found.as_dict())

    def configurations(self) -> bytes:
        if self._configurations is None or time.monotonic() - self._configurations[0] > 30:
            self._configurations = (time.monotonic(), _json({"configurations": self.source.configurations()}))
        return self._configurations[1]

    def metrics(self) -> bytes:
        """The exposition as of the scrape: the source catches up first (a scrape is never a refresh late)."""
        self.source.refresh()
        return generate_latest(self.registry)

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
        self.source.close()


class _Handler(tornado.web.RequestHandler):
    live: Live

    def initialize(self, live: Live) -> None:
        self.live = live

    def set_default_headers(self) -> None:
        self.set_header("Content-Security-Policy", POLICY)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")
        self.clear_header("Server")

    def prepare(self) -> None:
        token = self.live.token
        if token is None:
            if self.request.host not in self.live.allowed_hosts:
                raise tornado.web.HTTPError(403, reason="Host not served here")
            return
        offered = self.request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or \
            self.get_cookie(COOKIE, "")
        if offered and hmac.compare_digest(offered.encode(), token.encode()):
            return
        given = self.get_query_argument("token", "")
        if self.request.path == "/" and given and hmac.compare_digest(given.encode(), token.encode()):
            self.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
            self.redirect("/", status=303)  # the token leaves the address bar and the history
            return
        raise tornado.web.HTTPError(401, reason="Token required")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}\n")

    def compute_etag(self) -> None:
        return None


class _Asset(_Handler):
    TYPES = {"index.html": "text/html; charset=utf-8", "live.js": "text/javascript; charset=utf-8",
             "live.css": "text/css; charset=utf-8"}

    def get(self, name: str = "index.html") -> None:
        self.set_header("Content-Type", self.TYPES[name])
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        if name == "live.css":  # the report's look, then the live view's own parts
            from ..results.report import CSS

            body = CSS.encode() + body
        self.finish(body)


class _State(_Handler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(self.live.latest)


class _Events(_Handler):
    """The page's document each time it changes (Server-Sent Events; a comment line keeps quiet links open)."""

    gone = False

    async def get(self) -> None:
        if self.live.streams >= MAX_STREAMS:
            raise tornado.web.HTTPError(503, reason="Too many open pages")
        self.live.streams += 1
        self.set_header("Content-Type", "text/event-stream")
        shown = -1
        try:
            while not self.gone:
                if self.live.version != shown:
                    shown = self.live.version
                    self.write(b"data: " + self.live.latest + b"\n\n")
                else:
                    self.write(b": still here\n\n")
                await self.flush()
                await self.live.next_change(KEEPALIVE_S)
        except tornado.iostream.StreamClosedError:
            pass
        finally:
            self.live.streams -= 1

    def on_connection_close(self) -> None:
        self.gone = True


class _Trend(_Handler):
    async def get(self) -> None:
        config = self.get_query_argument("config", "")[:MAX_QUERY]
        metric = self.get_query_argument("metric", "max_ns")[:MAX_QUERY]
        if not config:
            raise tornado.web.HTTPError(400, reason="config=NAME wanted")
        try:
            body = await self.live.call(self.live.trend, config, metric)
        except ValueError:  # the history's own check of the metric's name
            raise tornado.web.HTTPError(400, reason=f"metric one of {', '.join(METRICS)}") from None
        self.set_header("Content-Type", "application/json")
        self.finish(body)


class _Configurations(_Handler):
    async def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(await self.live.call(self.live.configurations))


class _Metrics(_Handler):
    async def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(await self.live.call(self.live.metrics))


def _application(live: Live) -> tornado.web.Application:
    routes: list[Any] = [(r"/", _Asset), (r"/(live\.js|live\.css)", _Asset), (r"/api/state", _State),
                         (r"/api/events", _Events), (r"/api/trend", _Trend),
                         (r"/api/configurations", _Configurations), (r"/metrics", _Metrics)]
    return tornado.web.Application([(path, handler, {"live": live}) for path, handler in routes],
                                   log_function=lambda handler: None, compress_response=False)


def _bind(listen: Listen) -> list[Any]:
    try:
        return tornado.netutil.bind_sockets(listen.port, listen.host)
    except OSError as exc:
        raise InputError(f"option --listen {listen.host}:{listen.port}: cannot listen there "
                         f"({exc.strerror or exc})") from None


async def _serve(live: Live, duration_s: float | None, announce: Callable[[str], None]) -> None:
    sockets = _bind(live.listen)
    port = int(sockets[0].getsockname()[1])
    live.allowed_hosts = {f"{name}:{port}" for name in ("localhost", "127.0.0.1", "[::1]")} | \
        {live.listen.url(port).removeprefix("http://").rstrip("/")}
    server = tornado.httpserver.HTTPServer(_application(live), max_header_size=16 * 1024, max_body_size=1024,
                                           idle_connection_timeout=60)
    server.add_sockets(sockets)
    await live.refresh()  # the first page already shows what is there
    refresher = asyncio.create_task(live.refresh_forever())
    announce(live.listen.url(port))
    try:
        if duration_s is None:
            await asyncio.Event().wait()
        else:
            await asyncio.sleep(duration_s)
    finally:
        server.stop()
        refresher.cancel()
        with contextlib.suppress(asyncio.CancelledError, RtvirtError):
            await refresher
        await server.close_all_connections()


def serve(source: LiveSource, listen: Listen, token: str | None, *, duration_s: float | None = None,
          refresh_s: float = 1.0, announce: Callable[[str], None] = print) -> None:
    """Serve ``source`` on ``listen`` until ``duration_s`` passed (None: until Ctrl-C or SIGTERM, raised as
    KeyboardInterrupt); ``announce`` is told the page's address once the socket listens. ``listen`` and
    ``token`` as rtvirt.live.access.access checked them: beyond loopback, never without a token."""
    if not listen.local and token is None:
        raise InputError(f"option --listen {listen.host}:{listen.port}: not a loopback address without a token")

    async def main() -> None:
        live = Live(source, token, listen, refresh_s)
        try:
            await _serve(live, duration_s, announce)
        finally:
            live.close()

    asyncio.run(main())
