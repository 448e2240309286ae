-- The tables of policies queue, replace and restart on PostgreSQL, beside the leases table
-- (schema.py). __schema__ is the lock schema's name. Each statement is IF NOT EXISTS.
--
-- __schema__.singleton_lock_parked      the calls parked behind a lock: (prefix, name, task_id)
--                                       the key; round and arrival their order (round 0 for
--                                       arrival order, rounds with lock_fair_by); fair the
--                                       call's fairness value; message what a hand-off sends
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
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_parked (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    round bigint NOT NULL DEFAULT 0,
    arrival bigint NOT NULL,
    fair text NOT NULL DEFAULT '',
    message bytea NOT NULL,
    PRIMARY KEY (prefix, name, task_id)
);
CREATE INDEX IF NOT EXISTS singleton_lock_parked_order
    ON __schema__.singleton_lock_parked (prefix, name, round, arrival);
CREATE SEQUENCE IF NOT EXISTS __schema__.singleton_lock_arrival;
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_superseded (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    until timestamptz NOT NULL,
    message bytea,
    mark_after timestamptz,
    PRIMARY KEY (prefix, name, task_id)
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
CREATE TABLE IF NOT EXISTS __schema__.singleton_lock_cancels (
    prefix text NOT NULL,
    name text NOT NULL,
    task_id text NOT NULL,
    until timestamptz NOT NULL,
    PRIMARY KEY (prefix, name)
);
