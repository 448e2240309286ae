"""A small threaded WSGI server from the standard library, for ``/metrics`` and the console."""

from __future__ import annotations

import socketserver
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    # a slow client (or a console ping that waits for a worker) must not block the next one
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line on stderr per request (a scrape every few seconds would fill a log)."""


def quiet_server(address: str, port: int, app: Callable[..., Any]) -> WSGIServer:
    """A threaded WSGI server for ``app`` on ``address:port`` (port 0: any free one)."""
    return make_server(
        address, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
