#!/usr/bin/env bash
# Start a Celery worker in the foreground, e.g.
#   deploy/worker.sh --queues grading,validation --concurrency 4     (sandbox CPU: processes)
#   deploy/worker.sh --queues generation                            (vLLM I/O: threads)
# Options go to `evoenv worker`: --queues/-Q, --concurrency/-c, --pool/-P, --name/-n.
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh):
#   EVOENV_REDIS_URL        the broker (all workers, Flower and the learner share it)
#   EVOENV_DATABASE_URL     the archive; empty: SQLite under EVOENV_DATA_DIR (one machine only)
#   EVOENV_VLLM_URLS        the model servers, for the generation queue
#   EVOENV_STREAM_KEY       signs the stream's entries: the learner's key (docs/deploy.md)
#   EVOENV_WORKER__*        concurrency, time limits, visibility timeout, retries
#   EVOENV_SANDBOX__*       limits of the sandbox that runs environment code
# SIGTERM stops it warmly: running jobs finish, or go back to the queue.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$EVOENV" worker "$@"
