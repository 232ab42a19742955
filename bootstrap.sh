#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root): installs what scalelab needs,
# idempotently, then runs an invoke task in the project's virtual environment.
#   ./bootstrap.sh demo    provision a local cluster, run the demo sweep, write the report
#   ./bootstrap.sh test    run the whole test suite
#   ./bootstrap.sh         only install
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(openssh-server openssh-client iproute2 iperf3 procps chromium
              nfs-ganesha nfs-ganesha-vfs libnfs-utils rsync g++ make dpkg-dev
              munge slurm-client slurmctld slurmd slurmdbd mariadb-server
              docker.io mmdebstrap sudo)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: apt packages missing (${missing[*]}); run as root to install them" >&2
    exit 1
  fi
  echo "bootstrap: installing ${missing[*]}"
  apt-get update -qq
  # No service of these packages starts on the host (munge, MariaDB, Slurm's daemons, Docker):
  # scalelab runs its own per node. A policy-rc.d of our own says so to the packages' scripts while
  # they install, and goes again (one that was there before is left alone).
  policy=/usr/sbin/policy-rc.d
  ours=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; ours=1
    trap 'rm -f "$policy"' EXIT  # also when the install fails
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -z "$ours" ] || { rm -f "$policy"; trap - EXIT; }
fi
# The packages' scripts may start services on the host, or enable them for the next boot;
# scalelab runs its own per node.
systemctl disable --now ssh.socket ssh.service nfs-ganesha.service munge.service \
  mariadb.service slurmctld.service slurmd.service slurmdbd.service docker.socket \
  docker.service containerd.service >/dev/null 2>&1 || true

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
