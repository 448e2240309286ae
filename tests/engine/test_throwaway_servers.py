"""The throwaway redis-server of celery_singleton_lock.testing, which every test that stops,
restarts or pauses a server starts: its start survives the race on the port it chose."""

from __future__ import annotations

import socket

from celery_singleton_lock.testing import RedisServer


def test_a_server_whose_chosen_port_was_taken_meanwhile_starts_on_another() -> None:
    server = RedisServer()
    taken = server.port
    with socket.socket() as squatter:  # another process bound it between choice and start
        squatter.bind(("127.0.0.1", taken))  # (as a client's ephemeral port: not listening)
        server.start()
        try:
            assert server.port != taken and server.client().ping()
        finally:
            server.stop()


def test_a_server_started_again_keeps_its_port() -> None:
    server = RedisServer().start()
    try:
        port = server.port
        server.restart()
        assert server.port == port and server.client().ping()
    finally:
        server.stop()
