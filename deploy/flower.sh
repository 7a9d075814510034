#!/usr/bin/env bash
# Start Flower, the web monitor of the queues and workers, in the foreground.
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh):
#   EVOENV_REDIS_URL            the broker the workers use
#   EVOENV_FLOWER__ADDRESS      default 127.0.0.1; another address needs basic auth
#   EVOENV_FLOWER__PORT         default 5555
#   EVOENV_FLOWER__BASIC_AUTH   user:password for the pages and the API (/api/workers,
#                               /api/queues/length, /api/tasks). Without it Flower's API
#                               answers 401 unless FLOWER_UNAUTHENTICATED_API=true is set.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$EVOENV" flower "$@"
