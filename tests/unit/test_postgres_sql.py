"""The PostgreSQL functions are versioned, never replaced (see
``celery_singleton_lock/engine/postgres/schema.py``): a function's text may change only under a
new name, which this table pins."""

from __future__ import annotations

import hashlib

from celery_singleton_lock.engine.postgres import schema

#: the versioned name of each function and the first 16 hex digits of the sha256 of its text
#: (from ``CREATE FUNCTION`` on: the contract above it may change freely). A text changed:
#: give the function the next version (``_v2``) in its file, then its new digest here.
PINNED = {
    "singleton_lock_row_v1": "f7229cb46e898599",
    "singleton_lock_take_v1": "27b03a75087307a9",
    "singleton_lock_reserve_v1": "af240db941075b86",
    "singleton_lock_turn_v1": "1abe63f5617ac443",
    "singleton_lock_take_slot_v1": "6c595449776b18a6",
    "singleton_lock_park_v2": "33f418d96fab4c17",
    "singleton_lock_hand_on_v2": "3944f5caf7787a53",
    "singleton_lock_latest_v1": "f86879951ff2515b",
}


def _digest(file: str) -> str:
    text = schema.sql_file(file)
    return hashlib.sha256(text[text.index("CREATE FUNCTION") :].encode()).hexdigest()[:16]


def test_each_function_text_is_the_one_pinned_to_its_versioned_name() -> None:
    found = {schema.function_name(file): _digest(file) for file in schema.FUNCTION_FILES}
    assert found == PINNED


def test_each_function_is_named_after_its_file_and_a_version() -> None:
    for file in schema.FUNCTION_FILES:
        assert schema.function_name(file).startswith(f"singleton_lock_{file}_v"), file


def test_no_function_file_replaces_a_function() -> None:
    for file in schema.FUNCTION_FILES:
        assert "OR REPLACE" not in schema.sql_file(file).upper(), file
