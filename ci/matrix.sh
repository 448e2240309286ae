#!/usr/bin/env bash
# The version matrix: the tests that depend on Celery, kombu and redis-py, run on each corner
# in a virtualenv of its own.
#   ci/matrix.sh [oldest] [newest]     (no argument: both; `./dev matrix` runs this)
#   oldest  .venv-oldest: every dependency at its declared floor, pinned in
#           ci/constraints-oldest.txt (ci/check_floors.py keeps it equal to pyproject.toml),
#           on the oldest Python requires-python accepts
#   newest  .venv-newest: the latest release of everything (upgraded on every run), on the
#           newest Python tested
# (the Python of each: ci/python.sh, which says how to pick another)
# Each corner runs the engine and unit tests and every tests/celery module (eager runs and the
# in-process worker included), but of test_real_workers.py only the scenarios on real `celery
# worker` processes listed in REAL_WORKERS below, in one pytest run. Prints one summary line per
# corner; exits non-zero if any corner failed. (run_corner runs in an `||` list, where bash
# ignores `set -e`: every step in it checks its own status.)
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/python.sh

PIP=(-m pip install -q --disable-pip-version-check)

# Processes side by side (pytest-xdist), one test module per process at a time: a module's
# workers and servers are its own fixtures (module- or session-scoped). As in ./dev test.
TEST_PROCESSES="${TEST_PROCESSES:-3}"
PARALLEL=(-n "$TEST_PROCESSES" --dist loadfile)

# Real `celery worker` processes, Redis broker: lease renewal on the prefork pool, time limits,
# revoke(terminate=True), a killed pool child, kill -9 of the whole worker. Left out: the other
# pools (the in-process worker covers threads), the contention runs (slow), RabbitMQ, and the
# redelivery scenarios, whose premise (a message handed out again within seconds) needs kombu
# 5.7's `unacked_restore_interval`: older kombu sweeps unacked messages every 10 s.
REAL_WORKERS="(prefork or time_limit or revoke or sigkill or kill_9) and not rabbitmq"

# Left out of the other modules for the same reason (a redelivery within seconds): the
# enqueue-dedupe redelivery scenario. Failed on kombu 5.3.0: the restored message came after
# the test's 30 s.
REDELIVERY_SCENARIOS=(
  --deselect
  tests/celery/test_enqueue_dedupe_processes.py::test_a_redelivered_message_takes_its_own_marker_and_runs_once
)

install() {
  local corner="$1" venv=".venv-$1" python
  case "$corner" in
    oldest) python="$(python_for "$OLDEST_PYTHON")" || return 1 ;;
    newest) python="$(python_for "$NEWEST_PYTHON")" || return 1 ;;
    *)
      echo "unknown corner: $corner (oldest | newest)" >&2
      return 2
      ;;
  esac
  make_venv "$venv" "$python" || return 1
  case "$corner" in
    oldest)
      python3 ci/check_floors.py || return 1   # reads files only: any Python 3.11+
      local stamp="$venv/.installed"
      if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] \
        || [ ci/constraints-oldest.txt -nt "$stamp" ]; then
        "$venv/bin/python" "${PIP[@]}" -c ci/constraints-oldest.txt -e ".[test]" || return 1
        touch "$stamp"
      fi
      "$venv/bin/python" ci/check_floors.py --installed || return 1
      ;;
    newest)
      "$venv/bin/python" "${PIP[@]}" --upgrade --upgrade-strategy eager -e ".[test]" || return 1
      ;;
  esac
}

versions() {
  "$1/bin/python" - <<'EOF'
from importlib.metadata import version
import platform
names = ("celery", "kombu", "redis", "pytest")
print(", ".join([f"Python {platform.python_version()}"] + [f"{n} {version(n)}" for n in names]))
EOF
}

# The "N passed ..." line pytest ends with, or what went wrong.
outcome() {
  grep -E '(passed|failed|error|no tests ran).* in [0-9.]+s' "$1" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//'
}

# --deselect for each test of test_real_workers.py that REAL_WORKERS leaves out: the scenarios
# kept run in the corner's one pytest run, their module in one process beside the others
# (a second run after it took ~30 s more).
left_out_real_workers() {
  local listed
  listed="$("$1/bin/python" -m pytest -p no:cacheprovider -q --collect-only \
    -k "not ($REAL_WORKERS)" tests/celery/test_real_workers.py)" || return 1
  grep '::' <<<"$listed" | sed 's/^/--deselect=/'
}

run_corner() {
  local corner="$1" venv=".venv-$1" log status=0 started left_out
  install "$corner" || { SUMMARY+=("$corner: could not be installed"); return 1; }
  left_out="$(left_out_real_workers "$venv")" \
    || { SUMMARY+=("$corner: could not list test_real_workers.py"); return 1; }
  local deselected=()
  [ -z "$left_out" ] || mapfile -t deselected <<<"$left_out"
  log="$(mktemp)"
  started=$SECONDS
  echo "== $corner: $(versions "$venv")"
  "$venv/bin/python" -m pytest -p no:cacheprovider -q "${PARALLEL[@]}" tests/engine tests/unit \
    tests/celery "${deselected[@]}" "${REDELIVERY_SCENARIOS[@]}" | tee "$log" || status=1
  SUMMARY+=("$corner ($(versions "$venv")): [$(outcome "$log")]; $((SECONDS - started)) s")
  rm -f "$log"
  return "$status"
}

corners=("$@")
[ ${#corners[@]} -gt 0 ] || corners=(oldest newest)
SUMMARY=()
failed=0
for corner in "${corners[@]}"; do
  run_corner "$corner" || failed=1
done
echo
printf '%s\n' "${SUMMARY[@]}"
exit "$failed"
