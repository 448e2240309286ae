"""The lock console: a WSGI app listing held locks, and ``locks serve`` to run it.

Mount :func:`make_console` in your own web app behind your own authentication (any WSGI
mount: its links are relative), or run ``celery -A proj locks serve`` (stdlib ``wsgiref``,
bound to 127.0.0.1 by default). Routes:

``GET /``                  the page; it refreshes itself from ``locks.json`` every 2 s
``GET /locks.json``        held locks (holder node, pid, whether the node answers a ping,
                           TTL left, fence, parked calls) and, when the app's metrics are on
                           and their directory is on this machine, per-task counters
``POST /release/confirm``  the confirmation step of a release (CSRF token required)
``POST /release``          the release, with ``confirm=yes`` and the CSRF token

Read-only unless made with ``allow_release=True`` (``serve --allow-release``). A release is
never done by a GET: any other method on a release URL is answered 405 and changes nothing.
A release goes through :func:`~.lock_release.release_lock`: refused while the holder's node
answers a ping, owner-checked. The CSRF token is random per console; a POST must carry it, and
one whose ``Origin`` names another host is refused.

``locks serve`` answers only requests whose ``Host`` header names the address it is bound to,
a loopback name (``localhost``), an IP address, or a name given with ``--allow-host``: a page
of another site whose name an attacker re-points at 127.0.0.1 (DNS rebinding) sends its own
name as the host and gets 421, never the lock list. A console mounted in your own WSGI app
checks no host unless made with ``allowed_hosts``: your server or proxy decides which names
reach it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Collection, Iterable, Optional
from urllib.parse import parse_qs, urlsplit

import click

from celery_singleton_lock.celery.cli.app_target import (
    CliError,
    ReleaseRefused,
    Target,
    open_target,
)
from celery_singleton_lock.celery.cli.console_page import confirm_page, lock_list_page, outcome_page
from celery_singleton_lock.celery.cli.lock_listing import (
    describe_holder,
    holder_json,
    is_worker_node,
    list_locks,
    lock_name_from_key,
    read_live_rules,
    read_slot,
    rule_json,
)
from celery_singleton_lock.celery.cli.lock_release import (
    node_is_alive,
    ping_timeout_option,
    release_lock,
)
from celery_singleton_lock.celery.observe.serving import quiet_server
from celery_singleton_lock.errors import LockError

#: Host names a console bound to loopback is reached by, besides IP addresses.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
#: Addresses that bind every interface: a console bound to one is reached by this machine's names.
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
#: Locks listed at most.
LIST_LIMIT = 500
#: Seconds a node's answer to a ping is reused.
ALIVE_FOR = 5.0
#: Bytes of a POST body read at most.
MAX_FORM = 8192

StartResponse = Callable[..., Any]
_HEADERS = [
    ("X-Frame-Options", "DENY"),
    ("Content-Security-Policy", "frame-ancestors 'none'"),
    ("Cache-Control", "no-store"),
]


class LockConsole:
    """The WSGI app; see the module docstring."""

    def __init__(
        self,
        target: Target,
        *,
        app: Any = None,
        allow_release: bool = False,
        ping_timeout: float = 1.0,
        allowed_hosts: Optional[Collection[str]] = None,
    ) -> None:
        self.target = target
        self.app = app
        self.allow_release = allow_release
        self.ping_timeout = ping_timeout
        #: the ``Host`` names answered (lower case, no port; IP addresses always are); None:
        #: every name (a console mounted behind the user's own server)
        self.allowed_hosts = (
            None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        )
        self.csrf = secrets.token_urlsafe(32)
        self._alive: dict[str, tuple[bool, float]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.target.close()

    # -- WSGI ----------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST") or ""
        if not self.host_allowed(host):
            message = (
                f"this console does not answer for host {host!r}; open it by the address it is "
                "served on (or start it with --allow-host NAME)"
            )
            return self._respond(
                start_response, "421 Misdirected Request", outcome_page("Wrong host", message)
            )
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO") or ""
        if path == "":  # mounted at /locks: the page's relative links need /locks/
            location = (environ.get("SCRIPT_NAME") or "") + "/"
            return self._respond(
                start_response, "301 Moved Permanently", "", [("Location", location)]
            )
        if path.startswith("/release"):
            if method != "POST":
                return self._respond(
                    start_response,
                    "405 Method Not Allowed",
                    outcome_page(
                        "Not allowed", "A release is a POST from the console's page.", "../"
                    ),
                    [("Allow", "POST")],
                )
            return self._post(environ, start_response, path)
        if method not in ("GET", "HEAD"):
            return self._respond(start_response, "405 Method Not Allowed", "", [("Allow", "GET")])
        if path == "/":
            return self._respond(
                start_response, "200 OK", lock_list_page(self.csrf, self.allow_release)
            )
        if path == "/locks.json":
            body = json.dumps(self.snapshot())
            return self._respond(start_response, "200 OK", body, content_type="application/json")
        return self._respond(start_response, "404 Not Found", outcome_page("Not found", path))

    def _respond(
        self,
        start_response: StartResponse,
        status: str,
        body: str,
        headers: Optional[list[tuple[str, str]]] = None,
        content_type: str = "text/html; charset=utf-8",
    ) -> list[bytes]:
        data = body.encode()
        start_response(
            status,
            [("Content-Type", content_type), ("Content-Length", str(len(data))), *_HEADERS]
            + (headers or []),
        )
        return [data]

    def host_allowed(self, host: str) -> bool:
        """True if a request whose ``Host`` header is ``host`` is answered: any when no names
        are set, else an IP address (a rebound name is sent as the name) or an allowed name."""
        if self.allowed_hosts is None:
            return True
        name = _host_name(host)
        if not name:
            return False  # HTTP/1.1 requires it; a browser always sends it
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return name in self.allowed_hosts
        return True

    # -- reading -------------------------------------------------------------------------------

    def alive(self, node: str) -> Optional[bool]:
        """Whether worker node ``node`` answers a ping (cached); None: it cannot be asked."""
        if self.app is None or not is_worker_node(node):
            return None
        now = time.monotonic()
        with self._lock:
            known = self._alive.get(node)
        if known is not None and known[1] > now:
            return known[0]
        try:
            answer = node_is_alive(self.app, node, self.ping_timeout)
        except LockError:
            return None
        with self._lock:
            self._alive[node] = (answer, now + ALIVE_FOR)
        return answer

    def snapshot(self) -> dict[str, Any]:
        """What ``locks.json`` answers."""
        listing = list_locks(self.target, LIST_LIMIT)
        prefix = self.target.inspector.prefix
        locks = [
            {**holder_json(holder, prefix), "parked": parked, "alive": self.alive(holder.host)}
            for holder, parked in sorted(
                zip(listing.holders, listing.parked), key=lambda pair: pair[0].key
            )
        ]
        now = time.time()
        rules = [
            rule_json(family, rule, now) for family, rule in read_live_rules(self.target).items()
        ]
        return {
            "server": self.target.server,
            "prefix": prefix,
            "locks": locks,
            "rules": rules,  # the live caps and pauses of tasks and groups
            "truncated": listing.truncated,
            "release": self.allow_release,
            "counters": self.counters(),
        }

    def counters(self) -> Optional[dict[str, dict[str, float]]]:
        """Per-task counts from the workers' metrics directory, when it is on this machine."""
        conf = getattr(self.app, "conf", None)
        directory = conf.get("singleton_lock_metrics_dir") if conf is not None else None
        if not directory or not os.path.isdir(directory):
            return None
        try:
            from prometheus_client import CollectorRegistry, multiprocess
        except ImportError:
            return None
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
        counts: dict[str, dict[str, float]] = {}
        wanted = {
            "celery_lock_acquired_total": "acquired",
            "celery_lock_duplicates_total": "duplicates",
            "celery_lock_lost_total": "lost",
        }
        for family in registry.collect():
            for sample in family.samples:
                column = wanted.get(sample.name)
                if column is not None:
                    row = counts.setdefault(
                        sample.labels.get("name", ""), dict.fromkeys(wanted.values(), 0.0)
                    )
                    row[column] += sample.value
        return counts

    # -- releasing -----------------------------------------------------------------------------

    def _post(
        self, environ: dict[str, Any], start_response: StartResponse, path: str
    ) -> list[bytes]:
        form = _form(environ)
        refused = self._refusal(environ, form)
        if refused is not None:
            return self._respond(
                start_response, "403 Forbidden", outcome_page("Refused", refused, "../")
            )
        # the key the page lists: a lock's, or one slot's of a lock_limit (``...}:slot:K``)
        name = form.get("name", "")
        try:
            lock_name, slot = lock_name_from_key(self.target, name)
            holder = read_slot(self.target, lock_name, slot)
        except LockError as exc:
            return self._respond(
                start_response, "400 Bad Request", outcome_page("Error", str(exc), "../")
            )
        if holder is None:
            return self._respond(
                start_response, "200 OK", outcome_page("Free", f"lock {name} is free now", "../")
            )
        if path == "/release/confirm":
            answer = self.alive(holder.host)
            if answer:
                message = (
                    f"lock {name} is held by {describe_holder(holder)}, whose node answers a "
                    "ping: it is running, and a running holder's lock is not released here. "
                    "It is freed when its task ends, or stop that worker first."
                )
                return self._respond(
                    start_response, "200 OK", outcome_page("Holder alive", message, "../")
                )
            said = {
                None: "cannot be asked",
                True: "ANSWERS a ping",
                False: "does not answer a ping",
            }
            page = confirm_page(
                self.csrf, name, describe_holder(holder), said[answer], holder.task_id or ""
            )
            return self._respond(start_response, "200 OK", page)
        if path != "/release" or form.get("confirm") != "yes":
            return self._respond(
                start_response,
                "400 Bad Request",
                outcome_page("Not confirmed", "no confirmation", "../"),
            )
        if holder.task_id != form.get("task_id"):
            message = f"lock {name} changed hands since the confirmation; nothing released"
            return self._respond(
                start_response, "409 Conflict", outcome_page("Changed hands", message)
            )
        app = self.app
        try:
            outcome = release_lock(
                self.target,
                lock_name,
                is_alive=lambda node: node_is_alive(app, node, self.ping_timeout),
                slot=slot,
            )
        except (ReleaseRefused, LockError) as exc:
            return self._respond(
                start_response, "409 Conflict", outcome_page("Not released", str(exc))
            )
        message = (
            f"lock {name} released (held by {describe_holder(holder)})"
            if outcome.released
            else f"lock {name} not released: it changed hands or was freed meanwhile"
        )
        return self._respond(
            start_response,
            "200 OK",
            outcome_page("Released" if outcome.released else "Not released", message),
        )

    def _refusal(self, environ: dict[str, Any], form: dict[str, str]) -> Optional[str]:
        if not self.allow_release:
            return "this console is read-only (start it with --allow-release)"
        if self.app is None:
            return "releases need the Celery app, to ask the holder's node whether it is alive"
        if not hmac.compare_digest(form.get("csrf", ""), self.csrf):
            return "missing or wrong CSRF token: release from the console's own page"
        origin = environ.get("HTTP_ORIGIN")
        if origin and origin != "null" and urlsplit(origin).netloc != environ.get("HTTP_HOST"):
            return f"a request from another site ({origin}) is refused"
        return None


def _host_name(host: str) -> str:
    """``Host`` header value without its port, brackets or trailing dot, lower case."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8089
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def served_names(bind: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names ``locks serve`` bound to ``bind`` answers for: the loopback names, the
    bound name itself, this machine's names when bound to every interface, and ``extra``."""
    names = set(LOOPBACK_NAMES) | {_host_name(name) for name in extra}
    if bind not in WILDCARD_BINDS:
        names.add(_host_name(bind))
    else:
        names.update(_host_name(name) for name in (socket.gethostname(), socket.getfqdn()))
    return frozenset(name for name in names if name)


def _form(environ: dict[str, Any]) -> dict[str, str]:
    try:
        length = min(int(environ.get("CONTENT_LENGTH") or 0), MAX_FORM)
    except ValueError:
        length = 0
    raw = environ["wsgi.input"].read(length).decode("utf-8", "replace") if length else ""
    return {key: values[0] for key, values in parse_qs(raw).items()}


def make_console(
    app: Any = None,
    *,
    url: Optional[str] = None,
    prefix: Optional[str] = None,
    allow_release: bool = False,
    ping_timeout: float = 1.0,
    allowed_hosts: Optional[Collection[str]] = None,
) -> LockConsole:
    """The console as a WSGI app, on ``app``'s lock server (or ``url``) and prefix: mount it
    behind your own authentication. Read-only unless ``allow_release``; answers every
    ``Host`` unless given ``allowed_hosts`` (see the module docstring)."""
    target = open_target(url=url, app=app, app_label="the app", prefix=prefix)
    return LockConsole(
        target,
        app=app,
        allow_release=allow_release,
        ping_timeout=ping_timeout,
        allowed_hosts=allowed_hosts,
    )


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8089, show_default=True)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--allow-release",
    is_flag=True,
    help="Offer a release button (a POST with a confirmation step and a CSRF token; refused "
    "while the holder's node answers a ping).",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="A host name the console answers for besides the bound address, loopback names and "
    "IP addresses (a name it is reached by, say through a tunnel); repeatable. Other names "
    "get 421: a re-pointed (DNS rebinding) name cannot read the locks.",
)
@ping_timeout_option(1.0, "Seconds a holder's worker node has to answer a ping.")
@click.pass_obj
def serve(
    settings: Any,
    port: int,
    bind: str,
    allow_release: bool,
    allow_hosts: tuple[str, ...],
    ping_timeout: float,
) -> None:
    """Serve the lock console: held locks, refreshed live, on http://BIND:PORT/.

    Read-only unless --allow-release. Bound to 127.0.0.1 by default: put it behind your
    own authentication before binding it elsewhere. Stops on Ctrl-C.
    """
    try:
        target = settings.target()
    except LockError as exc:
        raise CliError(str(exc)) from None
    console = LockConsole(
        target,
        app=settings.user_app,
        allow_release=allow_release,
        ping_timeout=ping_timeout,
        allowed_hosts=served_names(bind, allow_hosts),
    )
    server = quiet_server(bind, port, console)
    mode = "releases allowed" if allow_release else "read-only"
    click.echo(
        f"lock console on http://{bind}:{server.server_port}/ ({mode}), locks of "
        f"{target.server}; Ctrl-C to stop",
        err=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        console.close()
