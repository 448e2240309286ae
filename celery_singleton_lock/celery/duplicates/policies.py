"""The duplicate policies (``on_duplicate``): one small class each, side by side, and the one
registry that maps the option's names to them.

The policy object is chosen once, when a task's options are resolved (``LockOptions.policy``);
the task and its lock scope then ask it, never its name: whether the acquire parks the call
(:attr:`DuplicatePolicy.parks`), what a held lock does (:func:`on_held`), what a parked call
does, what a call that took the lock checks first, and how the release hands the lock on.
The policies are built from the actions of :mod:`.actions` (skip, fail, retry, wait),
:mod:`.join`, :mod:`.parking` and :mod:`.latest`; none of them imports the task class.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, ClassVar, Mapping, NoReturn, Optional

from celery.exceptions import Ignore

from celery_singleton_lock.celery import celery_api
from celery_singleton_lock.celery.config.app_settings import celery_setting
from celery_singleton_lock.celery.duplicates import actions, latest, restart
from celery_singleton_lock.celery.duplicates import parking as handoff
from celery_singleton_lock.celery.duplicates.join import join, rejoin
from celery_singleton_lock.engine import (
    AcquireRequest,
    AcquireResult,
    Latest,
    Lease,
    Parked,
    required,
)
from celery_singleton_lock.errors import LockConfigurationError

#: The acquire a waiting policy repeats (``wait``, ``join``): it never parks.
Acquire = Callable[[], AcquireResult]

log = logging.getLogger("celery_singleton_lock.duplicate")


class DuplicatePolicy:
    """What a call does when another execution holds its lock; the defaults are those of a
    policy that neither parks nor waits (``skip``)."""

    #: the option's value that chooses this policy
    name: ClassVar[str] = ""
    #: a worker's acquire parks the message behind a held lock (in the same round trip), and
    #: the holder's release hands the lock on to it: :meth:`park`, :meth:`parked`,
    #: :meth:`release` (and a finish record keeps a hand-off sent twice from running twice)
    parks: ClassVar[bool] = False
    #: what a lock backend must support for it (fields of ``Capabilities``)
    needs: ClassVar[tuple[str, ...]] = ()
    #: it parks calls behind the slots of the lock's slot table (engine/slots.py), one slot
    #: or many: every call of the task keeps its lock there (``LockOptions.slotted``)
    parks_behind_slots: ClassVar[bool] = False
    #: a held lock sends the message again later: with ``dedupe_on_enqueue`` the acquire keeps
    #: the call's queued marker meanwhile
    resends: ClassVar[bool] = False
    #: a held lock keeps the call waiting in its worker slot to run then: with
    #: ``dedupe_on_enqueue='until_started'`` it stays queued meanwhile (it has not started)
    waits_in_place: ClassVar[bool] = False
    #: in an eager call (``apply()``) there is no message to send again or park and no
    #: stored result to join: such a policy waits in place instead
    waits_when_eager: ClassVar[bool] = False
    #: what it does with a held lock stores a state under the call's task id: a copy that
    #: finds its own task id holding the lock skips instead (that state is the holder's)
    stores_state: ClassVar[bool] = False
    #: a newer call asks the running one to stop: its body's ``self.request.lock.cancelled``
    #: reads the flag, and a prefork worker's main process ends it after ``lock_cancel_grace``
    restarts: ClassVar[bool] = False
    #: its parked calls are handed the lock in an order ``lock_fair_by`` can make fair (round
    #: robin across values); a policy where one call waits has no order to make fair
    orders_parked: ClassVar[bool] = False
    #: why it cannot serve a ``lock_group`` ("": it can): its call would answer for, or with,
    #: a call of another task of the group
    not_in_a_group: ClassVar[str] = ""
    #: what a call that took the lock does before its body, or None (read on the hot path)
    acquired: Optional[Callable[[Any, Any], None]] = None

    def check(self, task: str, chosen: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
        """Refuse (``LockConfigurationError``) options this policy cannot honour; ``chosen``:
        the task's option values (validated) and ``ignore_result``."""

    def sending(self, options: dict[str, Any]) -> None:
        """``apply_async`` sends a call with ``options``: what this policy adds to them."""

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        """The lock is held: end the execution, or return the lease a wait got."""
        actions.skip(duplicate)

    def park(self, task: Any, request: Any, options: Any, wanted: AcquireRequest) -> AcquireRequest:
        """The acquire of a worker's call of a parking policy, told to park its message."""
        return wanted

    def parked(
        self, duplicate: actions.Duplicate, parked: Parked, wanted: AcquireRequest
    ) -> NoReturn:
        """The acquire parked the call (policies that park only)."""
        raise AssertionError(f"on_duplicate={self.name!r} parks nothing")

    def release(
        self, scope: Any, options: Any, cooldown: Optional[float], remember_for: Optional[float]
    ) -> bool:
        """Release ``scope``'s lease handing the lock on to a parked call (policies that park
        only); True if the lease was still ours."""
        raise AssertionError(f"on_duplicate={self.name!r} hands nothing on")

    def stop_cancelled(self, task: Any, request: Any, key: str) -> NoReturn:
        """End the running call ``request``, which a newer call asked to stop (policies that
        restart only)."""
        raise AssertionError(f"on_duplicate={self.name!r} stops no running call")

    def reclaimed(self, task: Any, locker: Any, name: str) -> None:
        """The worker reclaimed lock ``name`` from a dead pool child of ``task``: hand it on
        now to a call parked behind it (not at the dead holder's TTL, when a sweeper would)."""


class Skip(DuplicatePolicy):
    """End without running the body; ``DuplicateTaskSkipped`` is the stored outcome."""

    name = "skip"


class Fail(DuplicatePolicy):
    """End with ``DuplicateTaskError``."""

    name = "fail"
    stores_state = True

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        actions.fail(duplicate)


class Retry(DuplicatePolicy):
    """Send the call again after a jittered backoff (``lock_retry_backoff``)."""

    name = "retry"
    resends = True
    waits_when_eager = True

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        actions.retry(duplicate)


class Wait(DuplicatePolicy):
    """Block the worker slot until the release, up to ``lock_wait_timeout``, then retry."""

    name = "wait"
    waits_in_place = True

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        return actions.wait(duplicate, acquire)


class Join(DuplicatePolicy):
    """Wait for the running call and take its outcome (see :mod:`.join`)."""

    name = "join"
    not_in_a_group = (
        "a join takes THE running execution's outcome, and in a group that execution may be "
        "another task's, whose result would be returned as this call's"
    )
    waits_when_eager = True
    stores_state = True

    def __init__(self) -> None:
        self.acquired = rejoin  # a join's lock retry whose holder ended while it travelled

    def check(self, task: str, chosen: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
        """A join ends with the outcome its holder stored: the task's results must be stored
        (``ignore_result`` is resolved from ``task_ignore_result`` by Celery's ``bind``)."""
        if chosen["ignore_result"]:
            raise LockConfigurationError(
                f"task {task}: on_duplicate='join' needs the task's results, but it has "
                "ignore_result=True; set ignore_result=False or choose another on_duplicate"
            )
        if celery_setting(conf, "result_backend") in (None, "", "disabled"):
            raise LockConfigurationError(
                f"task {task}: on_duplicate='join' needs a result backend to read the running "
                "execution's outcome from; set the app's result_backend or choose another "
                "on_duplicate"
            )

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        return join(duplicate, acquire)


class Queue(DuplicatePolicy):
    """Park the call behind the lock; the releases hand the lock on in arrival order (see
    :mod:`.parking`). A call that could not be parked takes a lock retry."""

    name = "queue"
    parks = True
    needs: ClassVar[tuple[str, ...]] = ("parking",)
    parks_behind_slots = True
    waits_when_eager = True
    stores_state = True
    orders_parked = True
    #: what it runs (against dedupe_on_enqueue), and what waits, for the registration errors
    runs = (
        "every duplicate, one after the other, but dedupe_on_enqueue=True drops them before "
        "they are queued"
    )
    waiting = "parked message"

    def check(self, task: str, chosen: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
        """Parking runs the duplicates: it cannot also drop them at enqueue, and it needs the
        finish record that keeps a hand-off sent twice from running twice."""
        if chosen["dedupe_on_enqueue"]:
            raise LockConfigurationError(
                f"task {task}: on_duplicate={self.name!r} runs {self.runs}; choose one of the two"
            )
        if chosen["lock_finished_ttl"] is None:
            raise LockConfigurationError(
                f"task {task}: on_duplicate={self.name!r} needs lock_finished_ttl (it keeps a "
                f"{self.waiting} that was handed the lock twice from running twice); set it to "
                "a number of seconds (default 3600) or choose another on_duplicate"
            )

    def held(self, duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
        actions.retry(duplicate)  # a call that could not be parked (see parking.parked_message)

    def park(self, task: Any, request: Any, options: Any, wanted: AcquireRequest) -> AcquireRequest:
        fair = options.fair_value(request.args, request.kwargs)
        rank = options.priority_rank(celery_api.message_priority(request))
        return wanted._replace(park=handoff.parked_message(task, request), fair=fair, priority=rank)

    def parked(
        self, duplicate: actions.Duplicate, parked: Parked, wanted: AcquireRequest
    ) -> NoReturn:
        """The message is parked behind the lock: end now, holding no worker slot; the
        release before it sends it again. Its state is left as it is: it has not run yet."""
        for handed in (parked.handed, *parked.more_handed) if parked.handed is not None else ():
            # a slot was free but promised to an older parked message: this caller sends it
            handoff.publish(duplicate.task.app, handed, duplicate.name)
        holder = parked.holder
        if parked.paused:  # parked for the pause's end, whatever the slots (as skip's reason)
            duplicate.reason = "paused"
        elif holder is not None and holder.cooling:
            duplicate.reason = "cooldown"
        elif holder is None and wanted.rate is not None:
            duplicate.reason = "rate"
        elif wanted.limit != 1:
            duplicate.reason = "limit"  # as far as the reply tells (the slot freed first)
        if parked.paused:
            ahead = "paused (celery locks pause, pause_for)"
        elif holder is not None:
            ahead = actions.holding(duplicate.holder)
        else:
            ahead = "held by an older parked call"
        log.info(
            "task %s: lock %s %s; queued behind it (position %d)",
            duplicate.label,
            parked.key,
            ahead,
            parked.position,
        )
        duplicate.announce("queue")
        celery_api.logged_already(duplicate.request.id)
        raise Ignore(f"queued behind lock {parked.key} (position {parked.position})")

    def release(
        self, scope: Any, options: Any, cooldown: Optional[float], remember_for: Optional[float]
    ) -> bool:
        lease = scope.lease
        locker = lease.locker  # the backend that granted it
        queue = required(locker.queue, locker, f"on_duplicate={self.name!r}", "parking")
        owned, messages = queue.release_handing_on(
            lease,
            limit=scope.limit,
            rate=options.rate,
            cooldown=cooldown,
            reservation_ttl=options.send_window,
            remember_for=remember_for,
            cap_key=options.cap_key,
        )
        for message in messages:
            handoff.publish(scope.task.app, message, scope.name)
        return bool(owned)

    def reclaimed(self, task: Any, locker: Any, name: str) -> None:
        # a slot of a lock_limit too: the engine reads how the calls are parked
        queue = required(locker.queue, locker, f"on_duplicate={self.name!r}", "parking")
        for message in queue.hand_on(name, reservation_ttl=task.lock_options.send_window):
            handoff.publish(task.app, message, name)


class Replace(Queue):
    """The newest duplicate waits alone, parked, and runs after the holder (see
    :mod:`.latest`); ``lock_debounce`` holds each call back first."""

    name = "replace"
    needs = ("parking",)  # one call waits: no order to keep
    orders_parked = False
    not_in_a_group = (
        "latest wins drops the waiting call for a newer one, and in a group the newer call "
        "may be another task's: a call of this task would be superseded by a different kind "
        "of work"
    )
    runs = (
        "the newest duplicate once the running call ends, but dedupe_on_enqueue=True drops "
        "every newer call before it is queued"
    )
    waiting = "waiting call"

    def sending(self, options: dict[str, Any]) -> None:
        options["headers"] = latest.stamped(options.get("headers"))  # sending orders calls

    def park(self, task: Any, request: Any, options: Any, wanted: AcquireRequest) -> AcquireRequest:
        request.headers = headers = latest.stamped(request.headers)  # kept by its parked message
        park = handoff.parked_message(task, request)
        debounce, sent = options.debounce or 0.0, headers[latest.SENT_HEADER]
        newest = None if park is None else Latest(debounce, options.debounce_max, sent)
        return wanted._replace(park=park, latest=newest)

    def parked(
        self, duplicate: actions.Duplicate, parked: Parked, wanted: AcquireRequest
    ) -> NoReturn:
        latest.wait_newest(duplicate, parked)

    def reclaimed(self, task: Any, locker: Any, name: str) -> None:
        # sent now, as queue's: the sweeper would look only at the dead holder's old TTL; a
        # debounced call is left to it (the index holds its due time)
        if not task.lock_options.debounce:
            super().reclaimed(task, locker, name)

    def release(
        self, scope: Any, options: Any, cooldown: Optional[float], remember_for: Optional[float]
    ) -> bool:
        # no slots, rate or cooldown here: refused at registration (see config/limits.py)
        lease = scope.lease
        locker = lease.locker  # the backend that granted it
        latest_wins = required(locker.latest, locker, f"on_duplicate={self.name!r}", "parking")
        owned, handed = latest_wins.release_latest(
            lease, reservation_ttl=options.send_window, remember_for=remember_for
        )
        if handed is not None:
            handoff.publish(scope.task.app, handed, scope.name)
        return bool(owned)


class Restart(Replace):
    """The newest call waits as ``replace``'s does and asks the running call to stop (see
    :mod:`.restart`): cooperative through ``self.request.lock.cancelled``, and on prefork
    its pool child is terminated ``lock_cancel_grace`` seconds later."""

    name = "restart"
    restarts = True
    runs = (
        "the newest duplicate at once, stopping the running call, but dedupe_on_enqueue=True "
        "drops every newer call before it is queued"
    )

    def check(self, task: str, chosen: Mapping[str, Any], conf: Mapping[str, Any]) -> None:
        super().check(task, chosen, conf)
        if chosen.get("lock_debounce") is not None:
            raise LockConfigurationError(
                f"task {task}: lock_debounce holds each call back before it may run, but "
                "on_duplicate='restart' stops the running call at once for the newest; use "
                "on_duplicate='replace' with lock_debounce, or restart without it"
            )

    def parked(
        self, duplicate: actions.Duplicate, parked: Parked, wanted: AcquireRequest
    ) -> NoReturn:
        restart.stop_holder_and_wait(duplicate, parked)

    def stop_cancelled(self, task: Any, request: Any, key: str) -> NoReturn:
        restart.end_cancelled(task, request, key)


#: The registry: ``on_duplicate``'s names (validated against it) -> the policy classes.
POLICIES: dict[str, type[DuplicatePolicy]] = {
    policy.name: policy for policy in (Skip, Retry, Wait, Fail, Join, Queue, Replace, Restart)
}
_WAIT, _SKIP = Wait(), Skip()


def on_held(duplicate: actions.Duplicate, acquire: Acquire) -> Lease:
    """Apply the task's policy to a held lock; returns a lease only if a ``wait`` got one, or
    a ``join`` found the holder gone without an outcome."""
    policy: DuplicatePolicy = duplicate.options.policy
    if policy.waits_when_eager and duplicate.request.is_eager:
        policy = _WAIT  # wait in place up to lock_wait_timeout, then fail
    if policy.stores_state and duplicate.holder.task_id == duplicate.request.id:
        policy = _SKIP  # a state stored under the running execution's id would clobber it
    return policy.held(duplicate, acquire)
