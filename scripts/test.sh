#!/usr/bin/env bash
# The whole test suite by tier, each timed: set-up, lint and types; unit tests (on every core),
# the sandbox's, and integration tests (not `slow`); end-to-end tests (`slow`: the real model
# and vLLM). Prints each tier's seconds at the end, and the 15 slowest tests of each run.
#
# EVOENV_TEST_DEADLINE (seconds since the epoch; .ci/run sets it to its start + 84 minutes):
# a run still going then is interrupted cleanly (pytest tears its fixtures down), the test that
# was running is named, and the script fails.
#
# Extra arguments run one pytest over them instead of the tiers, after set-up, e.g.
# `bash scripts/test.sh -m "not slow" -x` or `bash scripts/test.sh tests/sandbox`.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -a TIERS=()
CURRENT_TEST=$(mktemp)
trap 'rm -f "$CURRENT_TEST"' EXIT
export EVOENV_CURRENT_TEST_FILE="$CURRENT_TEST"

summary() {
  ((${#TIERS[@]})) || return 0
  echo "== tier times" >&2
  printf '  %s\n' "${TIERS[@]}" >&2
}

# tier NAME COMMAND...: run COMMAND as one timed tier, within what is left of the deadline.
tier() {
  local name=$1 start rc=0
  shift
  echo "== $name" >&2
  start=$(date +%s)
  : >"$CURRENT_TEST"
  if [ -n "${EVOENV_TEST_DEADLINE:-}" ]; then
    local left=$((EVOENV_TEST_DEADLINE - start))
    if ((left <= 0)); then
      echo "error: the test budget ran out before the '$name' tier" >&2
      summary
      exit 1
    fi
    # SIGINT lets pytest tear its fixtures down (servers, workers); KILL two minutes later.
    timeout --foreground --signal=INT --kill-after=120 "$left" "$@" || rc=$?
  else
    "$@" || rc=$?
  fi
  TIERS+=("$(printf '%-28s %5d s' "$name" $(($(date +%s) - start)))")
  if ((rc == 124 || rc == 137)) && [ -n "${EVOENV_TEST_DEADLINE:-}" ] &&
    (($(date +%s) >= EVOENV_TEST_DEADLINE)); then
    local running
    running=$(cat "$CURRENT_TEST")
    echo "error: the test budget ran out during the '$name' tier, while running: ${running:-no test (collecting or between tests)}" >&2
    summary
    exit 1
  fi
  if ((rc != 0)); then
    summary
    exit "$rc"
  fi
}

tier "set-up" bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

if (($#)); then
  tier "pytest $*" python -m pytest "$@"
  summary
  exit 0
fi

tier "lint and types" bash -c "ruff check . && mypy"
# Tests that time processes or a terminal (the sandbox's seconds-long limits, the learner's
# hangup and supervisor tests) run alone, the rest of the unit tests on every core.
TIMED=(tests/sandbox tests/learner/test_hangup.py tests/learner/test_supervisor.py)
tier "unit (parallel)" python -m pytest -m "not slow and not integration" -n auto \
  "${TIMED[@]/#/--ignore=}"
tier "unit (timed, alone)" python -m pytest -m "not slow and not integration" "${TIMED[@]}"
tier "integration" python -m pytest -m "integration and not slow"
tier "end-to-end" python -m pytest -m slow
summary
