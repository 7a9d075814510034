#!/usr/bin/env bash
# The main job on the embedded default: list the seeds (run in the sandbox, a quick check of
# the set-up), then the whole loop on this machine (`evoenv up`).
# Arguments go to `evoenv up`, e.g. `bash scripts/run.sh --steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/evoenv seeds
exec .venv/bin/evoenv up "$@"
