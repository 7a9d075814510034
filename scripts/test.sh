#!/usr/bin/env bash
# The whole test suite: lint, types, then every test (unit, integration, slow) with durations.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow" -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff" >&2
ruff check .
echo "== mypy" >&2
mypy
echo "== pytest" >&2
exec python -m pytest "$@"
