"""Invalid configuration fails at task registration or worker start, naming the task.

The worker-start check is called directly here; tests/celery/test_worker_start.py shows a
real ``celery worker`` refusing to start on the same errors.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask
from celery_singleton_lock.celery.config.options import POLICIES, TASK_OPTIONS, Count, Seconds
from celery_singleton_lock.celery.duplicates.policies import POLICIES as POLICY_CLASSES
from celery_singleton_lock.celery.worker.start_checks import check_configuration


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("cfg", set_as_current=False, broker="memory://")
    app.conf.singleton_lock_url = "redis://127.0.0.1:1/0"  # never contacted here
    app.finalize()
    yield app
    app.close()


def register(app: Celery, **options: Any) -> Any:
    def job(account_id: int, cents: int = 0) -> None:
        return None

    # shared=False: a shared task would be re-registered on every app finalized later
    return app.task(name="billing.job", base=LockedTask, shared=False, **options)(job)


@pytest.mark.parametrize("policy", ["ignore", "SKIP", "", None, 3])
def test_unknown_policy_fails_at_registration(app: Celery, policy: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*on_duplicate"):
        register(app, on_duplicate=policy)


def test_every_documented_policy_is_a_registered_class_chosen_once(app: Celery) -> None:
    # the docs list options.POLICIES; the registry maps the same names, in the same order
    assert tuple(POLICY_CLASSES) == POLICIES
    app.conf.result_backend = "redis://127.0.0.1:1/0"  # join reads outcomes (never contacted)

    def job(account_id: int) -> None:
        return None

    for name, policy in POLICY_CLASSES.items():
        task = app.task(name=f"billing.{name}", base=LockedTask, shared=False, on_duplicate=name)
        assert type(task(job).lock_options.policy) is policy


#: what a duration option needs beside it to be accepted at all
_BESIDE: dict[str, dict[str, Any]] = {
    "lock_retry_backoff": {"lock_retry_backoff_max": 86_400},
    "lock_debounce": {"on_duplicate": "replace"},
    "lock_debounce_max": {"on_duplicate": "replace", "lock_debounce": 0.05},
    "lock_cancel_grace": {"on_duplicate": "restart"},
}
#: every task option whose allowed values are a declared range of seconds
_DURATIONS = {
    name: option.allowed
    for name, option in TASK_OPTIONS.items()
    if isinstance(option.allowed, Seconds)
}


@pytest.mark.parametrize("name", sorted(_DURATIONS))
def test_a_duration_past_its_declared_range_is_refused_naming_that_range(
    app: Celery, name: str
) -> None:
    high = _DURATIONS[name].high
    with pytest.raises(
        LockConfigurationError, match=rf"billing\.job: {name}=.*to {high:g} seconds"
    ):
        register(app, **_BESIDE.get(name, {}), **{name: high * 2})


@pytest.mark.parametrize("name", sorted(_DURATIONS))
def test_a_duration_at_the_top_of_its_declared_range_is_accepted(app: Celery, name: str) -> None:
    high = _DURATIONS[name].high
    task = register(app, **_BESIDE.get(name, {}), **{name: high})
    assert task.lock_options is not None


#: every task option whose allowed values are a declared count
_COUNTS = {
    name: option.allowed
    for name, option in TASK_OPTIONS.items()
    if isinstance(option.allowed, Count)
}


@pytest.mark.parametrize("name", sorted(_COUNTS))
def test_a_count_below_its_declared_lowest_is_refused_naming_it(app: Celery, name: str) -> None:
    low = _COUNTS[name].low
    with pytest.raises(LockConfigurationError, match=rf"billing\.job: {name} must be .*>= {low}"):
        register(app, **{name: low - 1})


@pytest.mark.parametrize("name", sorted(_COUNTS))
def test_a_count_at_its_declared_lowest_is_accepted(app: Celery, name: str) -> None:
    low = _COUNTS[name].low
    task = register(app, **{name: low})
    assert task.lock_options is not None


@pytest.mark.parametrize("ttl", [0, -1, 0.01, 10**9, math.inf, math.nan, "15", True])
def test_non_positive_or_absurd_ttl_fails_at_registration(app: Celery, ttl: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*lock_ttl"):
        register(app, lock_ttl=ttl)


def test_lock_on_naming_a_missing_parameter_fails_at_registration(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*accout_id"):
        register(app, lock_on=("accout_id",))


def test_lock_on_and_lock_key_together_fail_at_registration(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*not both"):
        register(app, lock_on=("account_id",), lock_key=lambda account_id, cents=0: "x")


def test_non_callable_lock_key_fails_at_registration(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*callable"):
        register(app, lock_key="account_id")


@pytest.mark.parametrize("retries", [-1, 1.5, "3", True])
def test_invalid_lock_retry_budget_fails_at_registration(app: Celery, retries: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*lock_max_retries"):
        register(app, lock_max_retries=retries)


def test_backoff_cap_below_its_base_fails_at_registration(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match="lock_retry_backoff_max"):
        register(app, lock_retry_backoff=5, lock_retry_backoff_max=1)


@pytest.mark.parametrize("prefix", ["locks{x}", "has space", "", "tab\there", "x" * 65])
def test_key_prefix_with_odd_characters_fails_at_registration(app: Celery, prefix: str) -> None:
    app.conf.singleton_lock_prefix = prefix
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*prefix"):
        register(app)


def test_app_settings_supply_defaults(app: Celery) -> None:
    app.conf.singleton_lock_ttl = 3
    app.conf.singleton_lock_on_duplicate = "retry"
    options = register(app).lock_options
    assert (options.ttl, options.on_duplicate) == (3.0, "retry")


def test_task_attributes_override_app_settings(app: Celery) -> None:
    app.conf.singleton_lock_ttl = 3
    app.conf.singleton_lock_max_retries = 5
    options = register(app, lock_ttl=7, lock_max_retries=None).lock_options
    assert (options.ttl, options.max_retries) == (7.0, None)


def test_defaults_suit_balance_updates(app: Celery) -> None:
    options = register(app).lock_options
    assert options.ttl == 15.0 and options.max_retries is None
    assert options.on_duplicate == "skip" and options.on_backend_error == "retry"


def test_misspelt_setting_fails_at_worker_start(app: Celery) -> None:
    app.conf.singleton_lock_tll = 5
    with pytest.raises(LockConfigurationError, match="singleton_lock_tll"):
        check_configuration(app)


def test_misspelt_setting_error_suggests_the_setting_meant(app: Celery) -> None:
    app.conf.singleton_lock_on_duplicat = "retry"
    with pytest.raises(LockConfigurationError, match=r"did you mean singleton_lock_on_duplicate\?"):
        check_configuration(app)


def test_misspelt_setting_error_points_at_the_options_docs_page(app: Celery) -> None:
    app.conf.singleton_lock_tll = 5
    with pytest.raises(LockConfigurationError, match=r"docs/reference/options\.md"):
        check_configuration(app)


def test_misspelt_task_option_error_points_at_the_options_docs_page(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"docs/reference/options\.md"):
        register(app, lock_tll=5)


# celery-singleton's settings (its celery_singleton.config.Config)
CELERY_SINGLETON_SETTINGS = (
    "singleton_lock_expiry",
    "singleton_backend_url",
    "singleton_backend_class",
    "singleton_backend_kwargs",
    "singleton_key_prefix",
    "singleton_raise_on_duplicate",
    "singleton_json_encoder_class",
)


#: values of the shape celery-singleton takes: compat.Singleton reads the first two (the app
#: has drop-in tasks: lockapp's are shared), and refuses a value of the wrong shape
VALUES = {"singleton_lock_expiry": 60, "singleton_key_prefix": "SINGLETONLOCK_"}


@pytest.mark.parametrize("setting", CELERY_SINGLETON_SETTINGS)
def test_celery_singleton_setting_is_not_taken_for_a_misspelling(app: Celery, setting: str) -> None:
    register(app)
    app.conf[setting] = VALUES.get(setting, "value of celery-singleton's")
    check_configuration(app)


def test_valid_configuration_passes_the_worker_start_check(app: Celery) -> None:
    register(app)
    app.conf.singleton_lock_ttl = 5
    check_configuration(app)


def test_non_redis_lock_url_fails_at_worker_start(app: Celery) -> None:
    app.conf.singleton_lock_url = "amqp://guest@localhost//"
    with pytest.raises(LockConfigurationError, match="not a Redis URL"):
        check_configuration(app)


def test_setting_changed_after_registration_is_checked_at_worker_start(app: Celery) -> None:
    register(app)
    app.conf.singleton_lock_on_duplicate = "drop"
    # every locked task of the app is checked (shared tasks of other modules included)
    with pytest.raises(LockConfigurationError, match=r"task \S+: on_duplicate='drop'"):
        check_configuration(app)


@pytest.mark.parametrize("replicas", [-1, 1.5, "1", True])
def test_invalid_min_replicas_fails_at_registration(app: Celery, replicas: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*lock_min_replicas"):
        register(app, lock_min_replicas=replicas)


@pytest.mark.parametrize("dedupe", ["until_finished", "yes", 1, None])
def test_invalid_dedupe_on_enqueue_fails_at_registration(app: Celery, dedupe: Any) -> None:
    with pytest.raises(
        LockConfigurationError, match=r"billing\.job.*dedupe_on_enqueue.*until_started"
    ):
        register(app, dedupe_on_enqueue=dedupe)


@pytest.mark.parametrize("dedupe", [True, False, "until_started"])
def test_each_dedupe_on_enqueue_value_is_accepted(app: Celery, dedupe: Any) -> None:
    options = register(app, dedupe_on_enqueue=dedupe).lock_options
    assert options.dedupe_on_enqueue is (dedupe is not False)
    assert options.dedupe_until_started is (dedupe == "until_started")


@pytest.mark.parametrize("timeout", [0, -1, 61, "1"])
def test_invalid_min_replicas_timeout_fails_at_registration(app: Celery, timeout: Any) -> None:
    with pytest.raises(LockConfigurationError, match=r"billing\.job.*lock_min_replicas_timeout"):
        register(app, lock_min_replicas_timeout=timeout)


# -- task options checked like settings -----------------------------------------------------


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("lock_tll", "lock_ttl"),
        ("on_duplicat", "on_duplicate"),
        ("dedupe_on_enqueu", "dedupe_on_enqueue"),
        ("lock_max_retry", "lock_max_retries"),
        ("dedup_on_enqueue", "dedupe_on_enqueue"),
    ],
)
def test_misspelt_task_option_fails_at_registration_naming_the_option_meant(
    app: Celery, typo: str, meant: str
) -> None:
    with pytest.raises(
        LockConfigurationError, match=rf"task billing\.job: .*{typo} \(did you mean {meant}\?\)"
    ):
        register(app, **{typo: 5})


def test_misspelt_task_option_holding_a_callable_fails_at_registration(app: Celery) -> None:
    with pytest.raises(LockConfigurationError, match=r"lock_kye \(did you mean lock_key\?\)"):
        register(app, lock_kye=lambda account_id, cents=0: str(account_id))


def test_misspelt_option_of_a_class_based_task_fails_at_registration(app: Celery) -> None:
    class Rebuild(LockedTask):  # type: ignore[misc]
        name = "billing.rebuild"
        lock_tll = 5

        def run(self, account_id: int) -> None:
            return None

    with pytest.raises(LockConfigurationError, match=r"task billing\.rebuild: .*lock_tll"):
        app.register_task(Rebuild())


def test_method_of_a_class_based_task_named_like_an_option_is_left_alone(app: Celery) -> None:
    class Rebuild(LockedTask):  # type: ignore[misc]
        name = "billing.rebuild"

        def lock_description(self) -> str:
            return "rebuild"

        def run(self, account_id: int) -> None:
            return None

    assert app.register_task(Rebuild()).lock_options.ttl == 15.0


def test_own_constants_and_methods_of_a_class_based_task_named_lock_are_left_alone(
    app: Celery,
) -> None:
    class Rebuild(LockedTask):  # type: ignore[misc]
        name = "billing.rebuild"
        lock_prefix_doc = "the accounts' locks"  # a constant of the user's, not an option
        lock_docs = ("a", "b")

        def lock_helper(self) -> str:
            return "rebuild"

        def run(self, account_id: int) -> None:
            return None

    assert app.register_task(Rebuild()).lock_options.ttl == 15.0


def test_a_typo_of_an_option_in_a_class_based_task_is_refused_naming_the_option_meant(
    app: Celery,
) -> None:
    class Rebuild(LockedTask):  # type: ignore[misc]
        name = "billing.rebuild"
        lock_prefix_doc = "the accounts' locks"
        lock_tll = 5

        def run(self, account_id: int) -> None:
            return None

    with pytest.raises(
        LockConfigurationError, match=r"lock_tll \(did you mean lock_ttl\?\)"
    ) as info:
        app.register_task(Rebuild())
    assert "lock_prefix_doc" not in str(info.value)


def test_misspelt_option_of_a_class_based_task_fails_at_worker_start(app: Celery) -> None:
    class Rebuild(LockedTask):  # type: ignore[misc]
        name = "billing.rebuild"

        def run(self, account_id: int) -> None:
            return None

    app.register_task(Rebuild())
    Rebuild.lock_tll = 5  # after registration: only the worker-start check sees it
    with pytest.raises(LockConfigurationError, match=r"task billing\.rebuild: .*lock_tll"):
        check_configuration(app)
