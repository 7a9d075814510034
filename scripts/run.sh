#!/usr/bin/env bash
# The main job on the embedded default. Until the learner lands (see README, "Status"), it
# lists the seeds and shows one real problem from each, every one run in the sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
evoenv seeds
for seed in seeds/*.py; do
  evoenv sample "$(basename "$seed" .py)" --seed 0 --difficulty 2
done
