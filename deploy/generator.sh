#!/usr/bin/env bash
# Start a vLLM server (the generator, reviewer and solver policy) for the configured model and
# keep it in the foreground; stop it with SIGTERM or Ctrl-C.
#
# Settings (environment, then deploy/evoenv.env or $EVOENV_ENV_FILE; see deploy/env.sh), e.g.
#   EVOENV_MODEL            embedded model name (default qwen2.5-coder-0.5b-instruct), a local
#                           Hugging Face folder or a hub id
#   EVOENV_DATA_DIR         where prepared models live (default ~/.evoenv)
#   EVOENV_SERVE__HOST      bind address (default 127.0.0.1); any other needs the token below,
#                           as the weight-reload endpoints are on
#   EVOENV_SERVE__API_KEY   bearer token every route but /health requires (set: required on
#                           loopback too); the learner and the workers send it from theirs
#   EVOENV_SERVE__PORT      default 8000
#   EVOENV_SERVE__KV_CACHE_GIB, EVOENV_SERVE__MAX_MODEL_LEN, EVOENV_SERVE__DTYPE,
#   EVOENV_SERVE__EXTRA_ARGS ("--max-num-seqs 64 ..."), EVOENV_SERVE__WEIGHT_PUSH (reload|nccl)
# The learner and workers reach it through EVOENV_VLLM_URLS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$EVOENV" serve "$@"
