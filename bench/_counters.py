"""Redis's own counters, read by ``bench scale``: what the server says it spent, not what the
client waited (a loaded machine slows the client, not the server's account of a command).

``CONFIG RESETSTAT`` zeroes ``INFO commandstats`` (calls and microseconds per command).
Commandstats also count the commands a script runs (inside its EVALSHA's time), so a sum is
taken over the commands the client itself sent (a counting client names them). The longest
single call, which commandstats cannot give (they only sum), comes from the slow log, of the
calls clients sent (a script's own commands come from the client ``?:0``): it logs only calls
over a threshold, so that logging a script's many short commands does not lengthen the script
being measured. It is off between measurements: its entries would count in ``used_memory``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Dict, Iterator, Sequence

import redis

from ._common import BenchError, text

#: The bench's own reads and resets, never charged to what is measured.
META = frozenset({"config", "info", "slowlog", "ping", "hello", "client", "select"})
#: entries the slow log keeps (a measurement must log fewer)
LOGGED = 100_000
#: the client address the slow log gives the commands a script runs
SCRIPT_CLIENT = "?:0"


@dataclass(frozen=True)
class Spent:
    """Calls of one command and the server microseconds they took."""

    calls: int
    usec: int

    def per_call(self) -> float:
        return self.usec / self.calls if self.calls else 0.0


class Counters:
    """Reads and resets the counters of one private ``redis-server``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        client.config_set("slowlog-log-slower-than", -1)
        client.config_set("slowlog-max-len", LOGGED)

    def reset(self) -> None:
        """Zero commandstats (and the slow log): what follows is what is counted."""
        self.client.config_resetstat()
        self.client.slowlog_reset()

    def commands(self) -> Dict[str, Spent]:
        """Per command (lower case, e.g. ``evalsha``) since the last reset, the bench's own
        reads left out."""
        spent = {}
        for name, entry in self.client.info("commandstats").items():
            command = name.removeprefix("cmdstat_")
            if command.split("|", 1)[0] not in META and isinstance(entry, dict):
                spent[command] = Spent(int(entry["calls"]), int(entry["usec"]))
        return spent

    def of(self, command: str) -> Spent:
        return self.commands().get(command, Spent(0, 0))

    def spent(self, sent: Sequence[str]) -> Spent:
        """The server microseconds of ``sent``, the commands a client sent since the reset
        (each name once per call): the time of these commands' names, the same names run
        by scripts included (one ``GET`` of a script counts with a ``GET`` sent)."""
        commands = self.commands()
        usec = sum(commands.get(name.lower(), Spent(0, 0)).usec for name in set(sent))
        return Spent(len(sent), usec)

    @contextlib.contextmanager
    def calls_logged(self, slower_than_usec: int) -> Iterator[None]:
        """The slow log keeps every call over ``slower_than_usec`` while inside; reset on
        entry."""
        self.client.config_set("slowlog-log-slower-than", slower_than_usec)
        self.client.slowlog_reset()
        try:
            yield
        finally:
            self.client.config_set("slowlog-log-slower-than", -1)

    def longest_logged_usec(self) -> int:
        """The longest call a client sent that the slow log kept (0: none was kept)."""
        entries = self.client.slowlog_get(LOGGED)
        if len(entries) >= LOGGED:
            raise BenchError(f"more than {LOGGED:,} calls logged: measure fewer at once")
        return max(
            (
                int(entry["duration"])
                for entry in entries
                # redis-py < 5 does not parse the client of a slow-log entry: none is left out then
                if text(entry.get("client_address", b"")) != SCRIPT_CLIENT
                and text(entry["command"]).split(" ", 1)[0].lower() not in META
            ),
            default=0,
        )

    def used_memory(self) -> int:
        self.client.slowlog_reset()  # its entries are not what is weighed
        return int(self.client.info("memory")["used_memory"])
