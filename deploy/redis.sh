#!/usr/bin/env bash
# Start a local Redis in the foreground, for when none is given: append-only persistence, so a
# restart loses no acknowledged job, data under $EVOENV_DATA_DIR/redis. Point the other
# processes at it with EVOENV_REDIS_URL=redis://127.0.0.1:$EVOENV_REDIS_PORT/0.
# Extra arguments go to redis-server (e.g. --requirepass SECRET).
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh):
#   EVOENV_DATA_DIR            default ~/.evoenv
#   EVOENV_REDIS_PORT          default 6379
#   EVOENV_REDIS_BIND          default 127.0.0.1 (protected mode stays on)
#   EVOENV_REDIS_APPENDFSYNC   always (default: nothing acknowledged is lost) or everysec
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
data_dir="${EVOENV_DATA_DIR:-$HOME/.evoenv}"
data_dir="${data_dir/#\~/$HOME}/redis"
mkdir -p "$data_dir"
exec redis-server \
  --port "${EVOENV_REDIS_PORT:-6379}" \
  --bind "${EVOENV_REDIS_BIND:-127.0.0.1}" \
  --dir "$data_dir" \
  --appendonly yes \
  --appendfsync "${EVOENV_REDIS_APPENDFSYNC:-always}" \
  --save "" \
  "$@"
