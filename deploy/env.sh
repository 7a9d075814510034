# Sourced by the deploy scripts (not run): reads the settings file and finds `evoenv`.
#
# The settings file is $EVOENV_ENV_FILE when set, else deploy/evoenv.env when present. A variable
# already set in the environment wins over the file, so one setting can be changed per command:
#   EVOENV_FLOWER__PORT=5600 deploy/flower.sh
# `evoenv` is the project's .venv/bin/evoenv when there is one, else the one on PATH.

deploy_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
env_file="${EVOENV_ENV_FILE:-$deploy_dir/evoenv.env}"
if [[ -n "${EVOENV_ENV_FILE:-}" && ! -f "$env_file" ]]; then
  echo "error: EVOENV_ENV_FILE=$env_file: no such file" >&2
  exit 2
fi
if [[ -f "$env_file" ]]; then
  given="$(export -p | grep '^declare -x EVOENV_' || true)"
  set -a
  # shellcheck disable=SC1090
  source "$env_file"
  set +a
  eval "$given"
fi
EVOENV="$deploy_dir/../.venv/bin/evoenv"
if [[ ! -x "$EVOENV" ]]; then
  EVOENV="$(command -v evoenv)" || {
    echo "error: no evoenv command: run scripts/setup.sh, or install the project" >&2
    exit 127
  }
fi
