# The Python each virtualenv is built with (sourced by ./dev and ci/matrix.sh).
#   oldest corner (.venv-oldest)          the floor of pyproject.toml's requires-python (3.9)
#   newest corner (.venv, .venv-newest)   NEWEST_PYTHON below: the newest release tested
# Overrides, each a version such as 3.12 or an interpreter (a path or a command): PYTHON for
# ./dev's .venv, OLDEST_PYTHON and NEWEST_PYTHON for the corners. A version is found as
# `pythonX.Y` on PATH, else in pyenv's versions (its newest patch release); absent, the command
# stops and says so.

NEWEST_PYTHON="${NEWEST_PYTHON:-3.13}"

# The X.Y of `requires-python = ">=X.Y"`: the oldest corner runs on the oldest Python accepted.
declared_python_floor() {
  sed -n 's/^requires-python *= *">= *\([0-9][0-9.]*\)".*/\1/p' pyproject.toml
}
OLDEST_PYTHON="${OLDEST_PYTHON:-$(declared_python_floor)}"

# python_for 3.9 | /path/to/python | python3: print the interpreter to build a virtualenv with.
python_for() {
  local wanted="$1" found root
  case "$wanted" in
    [0-9]*) ;;
    *) # an interpreter named: a path or a command
      found="$(command -v "$wanted" 2>/dev/null || true)"
      if [ -n "$found" ] && "$found" -c '' 2>/dev/null; then
        echo "$found"
        return 0
      fi
      echo "$wanted: not a Python interpreter that runs" >&2
      return 1
      ;;
  esac
  # on PATH: a pyenv shim of a version that is not the selected one is there but fails to run
  found="$(command -v "python$wanted" 2>/dev/null || true)"
  if [ -n "$found" ] && "$found" -c '' 2>/dev/null; then
    echo "$found"
    return 0
  fi
  root="${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}"
  # its newest patch release: 3.9.18 after 3.9.2 (sort -V); the dot keeps 3.1 from 3.10
  found="$(ls -d "$root"/versions/"$wanted".*/bin/python"$wanted" 2>/dev/null | sort -V | tail -1)"
  if [ -n "$found" ] && "$found" -c '' 2>/dev/null; then
    echo "$found"
    return 0
  fi
  echo "Python $wanted not found: no python$wanted on PATH that runs, none in $root/versions." \
    "Install it (\`pyenv install $wanted\`) or name an interpreter: PYTHON=/path/to/python" \
    "for .venv, OLDEST_PYTHON=... or NEWEST_PYTHON=... for a corner of ci/matrix.sh" >&2
  return 1
}

# X.Y of an interpreter
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
}

# make_venv DIR PYTHON: create DIR with PYTHON, or rebuild it if it runs another X.Y (its
# install stamps go with it), and bring its pip up to date: the pip that Python 3.9's venv
# ships (23.0) backtracks for minutes over the test extras' dependencies.
make_venv() {
  local dir="$1" python="$2" want
  want="$(python_version "$python")" || return 1
  if [ -x "$dir/bin/python" ]; then
    [ "$(python_version "$dir/bin/python")" = "$want" ] && return 0
    echo "$dir runs Python $(python_version "$dir/bin/python"), not $want: rebuilding it"
  fi
  "$python" -m venv --clear "$dir" || return 1
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
}
