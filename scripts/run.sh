#!/usr/bin/env bash
# The main job on the embedded default: the whole loop on this machine (`evoenv up`).
# Arguments go to `evoenv up`, e.g. `bash scripts/run.sh --steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/evoenv up "$@"
