#!/usr/bin/env bash
# Prepare a machine to run raydiff: a Python environment with the pinned packages, the
# embedded Fashion-MNIST dataset and (for its test) Prometheus. Idempotent and quick on a second
# run.
#
#   scripts/setup.sh            # uses the active virtualenv, else creates ./.venv
#   RAYDIFF_SKIP_DATASET=1 ...  # skip the dataset check
#
# Prints the path of the environment's python on its last line (the Makefile reads it).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[raydiff setup] $*" >&2; }

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  py="$VIRTUAL_ENV/bin/python"
  log "using the active virtual environment $VIRTUAL_ENV"
else
  if [[ ! -x .venv/bin/python ]]; then
    log "creating a virtual environment in .venv"
    python3 -m venv .venv
  fi
  py="$PWD/.venv/bin/python"
fi

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  log "raydiff needs Python >= 3.11; $py is $("$py" -c 'import platform; print(platform.python_version())')."
  log "Create the environment with a newer interpreter, e.g. 'python3.11 -m venv .venv', and run again."
  exit 1
fi

# Re-install only when the dependency files change.
stamp_dir=$("$py" -c 'import sys; print(sys.prefix)')
stamp="$stamp_dir/.raydiff-setup-stamp"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]] || ! "$py" -c 'import raydiff, torch, ray' 2>/dev/null; then
  log "installing raydiff and its pinned dependencies (constraints.txt)"
  # uv installs the same pins as pip, in parallel: 48 s for a fresh .venv here, bytecode included
  # (pip: 2 min 30 s). Without uv (no index to fetch it from), pip does the same, slower.
  if "$py" -m pip install --quiet -c constraints.txt uv 2>/dev/null; then
    # uv reads no pip configuration: pass on the indexes, wheel folders and constraints that
    # pip is configured with (a local CPU build of torch, a mirror), and let it pick a release
    # from any of them as pip does.
    mapfile -t pip_settings < <("$py" -m pip config list | "$py" scripts/pip_settings_for_uv.py)
    # torch is named first: the pin selects the CPU build where a local wheel or the PyTorch
    # CPU index is configured; a bare 'torch' would pull several GB of CUDA packages.
    "$py" -m uv pip install --quiet --python "$py" --index-strategy unsafe-best-match --compile-bytecode \
      "${pip_settings[@]}" -c constraints.txt torch -e ".[dev]"
  else
    "$py" -m pip install --quiet --upgrade pip
    "$py" -m pip install --quiet -c constraints.txt torch
    "$py" -m pip install --quiet -c constraints.txt -e ".[dev]"
  fi
  echo "$want" > "$stamp"
else
  log "dependencies up to date"
fi

# Debian packages: the embedded dataset, the Prometheus server whose test reads every panel of
# raydiff's Grafana dashboard from a real run (tests/integration/test_dashboard_prometheus.py),
# and iproute2 for the cluster tier.
dataset_dir=/usr/share/datasets/fashion-mnist
packages=()
if [[ -z "${RAYDIFF_SKIP_DATASET:-}" ]] && ! ls "$dataset_dir"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  packages+=(dataset-fashion-mnist)
fi
if ! command -v prometheus >/dev/null; then
  packages+=(prometheus)
fi
# `ip netns` and veth pairs for the cluster tier's nodes (tests/cluster/netns_cluster.py).
if ! command -v ip >/dev/null; then
  packages+=(iproute2)
fi
if [[ ${#packages[@]} -gt 0 ]]; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
    log "installing the Debian packages ${packages[*]}"
    apt-get update -qq >&2
    # Without recommends: the server alone, not the node exporter Debian recommends beside it.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
  elif [[ " ${packages[*]} " == *" dataset-fashion-mnist "* ]]; then
    log "the embedded dataset is missing. Install it with:"
    log "    sudo apt-get update && sudo apt-get install -y ${packages[*]}"
    log "(or set RAYDIFF_SKIP_DATASET=1 to go on without it)"
    exit 1
  else
    # Only their tests need them: skipped without them, an error under CI (tests/conftest.py).
    log "${packages[*]} missing (their tests will skip). Install with:"
    log "    sudo apt-get update && sudo apt-get install -y ${packages[*]}"
  fi
fi
echo "$py"
