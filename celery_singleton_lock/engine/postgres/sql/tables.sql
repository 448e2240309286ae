-- The tables and sequences of the PostgreSQL backend. __schema__ is the lock schema's name
-- (schema.py). Each statement is IF NOT EXISTS.
--
-- __schema__.singleton_lock_leases      one row per lock name ever taken under a prefix:
--                                       (prefix, name) the key; token, pid, host, task_id its
--                                       holder; acquired_at and lease_until by the server's
--                                       clock (now()); fence the holder's fencing token. A free
--                                       lock keeps its row (token '', lease_until '-infinity'):
--                                       see locker.py for why
-- __schema__.singleton_lock_fence       the sequence the fences come from: strictly
--                                       increasing, never reused (a sequence survives a restart)
-- __schema__.singleton_lock_finished    finish records (prefix, name, task_id) until a time:
--                                       the release of an acks_late task remembers it ran to
--                                       the end
-- __schema__.singleton_lock_starts      the body starts of locks with a lock_rate: (prefix,
--                                       name, at, token) and until when it counts (at + the
--                                       window), trimmed to the window at each admission
--                                       (take_slot.sql)
-- __schema__.singleton_lock_queued      queued markers of dedupe_on_enqueue: one row per lock
--                                       name, the task id queued and until when (markers.py)
-- __schema__.singleton_lock_caps        live caps (celery locks limit): an integer per cap key
--
-- The calls parked behind a lock (policies queue, replace and restart):
--
-- __schema__.singleton_lock_parked      the calls parked behind a lock: (prefix, name, task_id)
--                                       the key; round and arrival the order of their turns:
--                                       without lock_fair_by, round is minus the call's rank
--                                       (its message's priority the broker's way, higher:
--                                       sooner), so a higher rank goes first, then arrival;
--                                       with it, the rounds across values (turn.sql); fair the
--                                       call's fairness value; rank the call's rank; fair_arrival
--                                       (lock_fair_by) the call's own arrival while it waits
--                                       for its value's turn (its arrival is its turn's: two
--                                       calls of one value swap turns when the later takes the
--                                       earlier's), NULL once handed a turn (it keeps that
--                                       one); message what a hand-off sends
-- __schema__.singleton_lock_arrival     the sequence of arrivals (strictly increasing)
-- __schema__.singleton_lock_superseded  the calls of policy replace a newer one displaced:
--                                       kept until `until` (a stale copy is refused); message
--                                       the call left to mark REVOKED (NULL once marked),
--                                       which a sweeper marks from mark_after on
-- __schema__.singleton_lock_latest      per lock (policy replace): sent, the stamp of the
--                                       newest call sent that waits, holds or held it (kept
--                                       until `until`); newest, the task id of the call
--                                       waiting; with lock_debounce, first (the burst's first
--                                       call) and due (when the waiting call may run)
-- __schema__.singleton_lock_cancels     per lock, the task id its newest call asked to stop
--                                       (policy restart), until `until`
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_leases (
    prefix text NOT NULL,
    name text NOT NULL,
    token text NOT NULL,
    pid integer,
    host text NOT NULL DEFAULT '',
    task_id text NOT NULL DEFAULT '',
    acquired_at timestamptz,
    lease_until timestamptz NOT NULL,
    fence bigint,
    PRIMARY KEY (prefix, name)
);
CREATE SEQUENCE IF NOT EXISTS __schema__.singleton_lock_fence;
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_finished (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (prefix, name, task_id)
);
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_starts (
    prefix text NOT NULL,
    name text NOT NULL,
    at timestamptz NOT NULL,
    token text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (prefix, name, at, token)
);
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_queued (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (prefix, name)
);
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_caps (
    key text PRIMARY KEY,
    cap integer NOT NULL
);
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_parked (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    round bigint NOT NULL DEFAULT 0,
    arrival bigint NOT NULL,
    fair text NOT NULL DEFAULT '',
    message bytea NOT NULL,
    rank integer NOT NULL DEFAULT 0,
    fair_arrival bigint,
    PRIMARY KEY (prefix, name, task_id)
);
CREATE INDEX IF NOT EXISTS singleton_lock_parked_order
    ON __schema__.singleton_lock_parked (prefix, name, round, arrival);
-- rank and fair_arrival came after the table's first text: a schema made before gets them
-- here (its rows rank 0, as they were parked). Only when missing: an ALTER TABLE locks the
-- table against every other statement, and only the table's owner may run it.
DO $alter$ BEGIN
IF NOT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = '__schema__.singleton_lock_parked'::regclass
                   AND attname = 'fair_arrival' AND NOT attisdropped) THEN
    ALTER TABLE __schema__.singleton_lock_parked
        ADD COLUMN IF NOT EXISTS rank integer NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS fair_arrival bigint;
END IF;
END $alter$;
-- a fairness value's calls waiting for its turn, the best first (turn.sql)
CREATE INDEX IF NOT EXISTS singleton_lock_parked_fair
    ON __schema__.singleton_lock_parked (prefix, name, fair, rank DESC, fair_arrival)
    WHERE fair_arrival IS NOT NULL;
CREATE SEQUENCE IF NOT EXISTS __schema__.singleton_lock_arrival;
-- a record per task id until a time, as the finish records are (their key included)
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_superseded (
    LIKE __schema__.singleton_lock_finished INCLUDING ALL,
    message bytea,
    mark_after timestamptz
);
CREATE INDEX IF NOT EXISTS singleton_lock_superseded_left
    ON __schema__.singleton_lock_superseded (prefix, mark_after) WHERE message IS NOT NULL;
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_latest (
    prefix text NOT NULL,
    name text NOT NULL,
    sent text NOT NULL DEFAULT '',
    until timestamptz NOT NULL,
    newest text,
    first timestamptz,
    due timestamptz,
    PRIMARY KEY (prefix, name)
);
-- one task id per lock name until a time, as the queued markers are (their key included)
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_cancels (
    LIKE __schema__.singleton_lock_queued INCLUDING ALL
);
