#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root): installs what scalelab needs,
# idempotently, then runs an invoke task in the project's virtual environment.
#   ./bootstrap.sh demo    provision a local cluster, run the demo sweep, write the report
#   ./bootstrap.sh test    run the whole test suite
#   ./bootstrap.sh         only install
set -euo pipefail
cd "$(dirname "$0")"

# The Debian packages scalelab needs, installed where missing; services of packages this run
# installs are kept from starting, those the machine already had are left as found.
scripts/install_packages.sh

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.scalelab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip wheel
  .venv/bin/pip install -q -c constraints.txt -e '.[train,dev]'
  touch "$stamp"
fi

# Horovod 0.28.1 needs two patches to build against torch 2.13; the script builds it once
# (about 3 minutes on 2 cores) and reinstalls it from its wheel cache afterwards.
SCALELAB_VENV="$PWD/.venv" scripts/build_horovod.sh

if [ $# -gt 0 ]; then
  exec .venv/bin/invoke "$@"
fi
