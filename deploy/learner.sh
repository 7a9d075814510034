#!/usr/bin/env bash
# Start the learner (orchestrator, GRPO trainer, weight publisher) in the foreground, resuming
# from the run's last checkpoint if there is one. Options go to `evoenv learner`
# (--steps N). SIGTERM or Ctrl-C stops it cleanly: checkpoint written, nothing lost.
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh):
#   EVOENV_REDIS_URL, EVOENV_DATABASE_URL   the shared Redis and archive
#   EVOENV_VLLM_URLS                        every vLLM server to push weights to
#   EVOENV_MODEL, EVOENV_DATA_DIR, EVOENV_RUN
#   EVOENV_STREAM_KEY                       checks the stream's entries: the workers' key
#   EVOENV_GRPO__*, EVOENV_LEARNER__*       the objective, batch, staleness, checkpoints, pushes
# One training device (GPU when present, else CPU). `--gpus N` (first argument) trains on N
# GPUs of this host through torchrun, sharded (FSDP2): rank 0 is the learner, every rank
# trains its share of every batch (see evoenv_learner/distributed.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
if [[ "${1:-}" == "--gpus" ]]; then
    gpus="${2:?--gpus needs a number}"
    shift 2
    exec "$(dirname "$EVOENV")/torchrun" --standalone --nproc_per_node "$gpus" --no-python \
        "$EVOENV" learner --resume "$@"
fi
exec "$EVOENV" learner --resume "$@"
