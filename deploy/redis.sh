#!/usr/bin/env bash
# Start a local Redis in the foreground, for when none is given: append-only persistence, so a
# restart loses no acknowledged job, data under $EVOENV_DATA_DIR/redis. Point the other
# processes at it with EVOENV_REDIS_URL=redis://:PASSWORD@HOST:$EVOENV_REDIS_PORT/0 (no
# ":PASSWORD@" without one). Extra arguments go to redis-server.
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh):
#   EVOENV_DATA_DIR            default ~/.evoenv
#   EVOENV_REDIS_PORT          default 6379
#   EVOENV_REDIS_BIND          default 127.0.0.1 (protected mode stays on); addresses,
#                              space-separated; any but loopback needs EVOENV_REDIS_PASSWORD
#   EVOENV_REDIS_PASSWORD      required from every client once set (given to redis-server on
#                              its standard input, not its command line)
#   EVOENV_REDIS_APPENDFSYNC   always (default: nothing acknowledged is lost) or everysec
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
read -ra addresses <<<"${EVOENV_REDIS_BIND:-127.0.0.1}"
password="${EVOENV_REDIS_PASSWORD:-}"
if [[ -z "$password" ]]; then
  for address in "${addresses[@]}"; do
    case "${address#-}" in
      127.*|::1|localhost) ;;
      *) echo "error: Redis would listen on $address without a password: set EVOENV_REDIS_PASSWORD" >&2
         exit 2 ;;
    esac
  done
fi
data_dir="${EVOENV_DATA_DIR:-$HOME/.evoenv}"
data_dir="${data_dir/#\~/$HOME}/redis"
mkdir -p "$data_dir"
config=()
if [[ -n "$password" ]]; then
  password="${password//\\/\\\\}"
  exec <<<"requirepass \"${password//\"/\\\"}\""
  config=(-)  # the configuration on standard input
fi
exec redis-server ${config[@]+"${config[@]}"} \
  --port "${EVOENV_REDIS_PORT:-6379}" \
  --bind "${addresses[@]}" \
  --dir "$data_dir" \
  --appendonly yes \
  --appendfsync "${EVOENV_REDIS_APPENDFSYNC:-always}" \
  --save "" \
  "$@"
