#!/usr/bin/env bash
# The main job on the embedded default. First a quick check of the set-up: the ten seeds and a
# real problem from each, every one run in the sandbox; then the whole loop on this machine
# (`evoenv up`: Redis, vLLM, workers, Flower, the learner). Arguments go to `evoenv up`,
# e.g. `bash scripts/run.sh --steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
evoenv=.venv/bin/evoenv
"$evoenv" seeds
for seed in seeds/*.py; do
  "$evoenv" sample "$(basename "$seed" .py)" --seed 0 --difficulty 1
done
exec "$evoenv" up "$@"
