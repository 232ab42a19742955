#!/usr/bin/env bash
# Install the Debian packages scalelab needs on the controller, where missing (bootstrap.sh
# calls it). scalelab runs its own sshd, munge, Slurm, MariaDB, NFS server and Docker per node and
# none on this machine, so:
# - a service of a package this run installs does not start while it installs, and is disabled
#   afterwards (the packages' scripts enable it for the next boot);
# - a service of a package the machine already had is the machine's own: never stopped,
#   disabled or restarted.
# A policy-rc.d of this script's own stops services from starting during the install; it
# names the packages being installed, so a run killed mid-install leaves a record that the next
# run reads: it removes that policy-rc.d and disables the services of those packages.
# Env (tests): SCALELAB_POLICY_RC (default /usr/sbin/policy-rc.d).
set -euo pipefail

APT_PACKAGES=(openssh-server openssh-client iproute2 iperf3 procps chromium
              nfs-ganesha nfs-ganesha-vfs libnfs-utils rsync g++ make dpkg-dev
              munge slurm-client slurmctld slurmd slurmdbd mariadb-server
              docker.io mmdebstrap sudo)
# package -> the units it brings (containerd comes with docker.io where it was not here)
declare -A SERVICES=([openssh-server]="ssh.socket ssh.service" [nfs-ganesha]="nfs-ganesha.service"
  [munge]="munge.service" [mariadb-server]="mariadb.service" [slurmctld]="slurmctld.service"
  [slurmd]="slurmd.service" [slurmdbd]="slurmdbd.service"
  [docker.io]="docker.socket docker.service" [containerd]="containerd.service")
POLICY=${SCALELAB_POLICY_RC:-/usr/sbin/policy-rc.d}
MARK="# scalelab install_packages: no service starts while these install:"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# The units of packages installed by scalelab (this run or one killed mid-install) are disabled.
keep_from_starting() {
  local units=() p
  for p in "$@"; do
    [ -n "${SERVICES[$p]:-}" ] && installed "$p" && read -ra u <<< "${SERVICES[$p]}" && units+=("${u[@]}")
  done
  [ ${#units[@]} -gt 0 ] || return 0
  echo "install_packages: kept from starting (installed by scalelab): ${units[*]}"
  if command -v systemctl >/dev/null; then
    systemctl disable --now "${units[@]}" >/dev/null 2>&1 || true
  fi
}

if [ -f "$POLICY" ] && grep -q "^$MARK" "$POLICY"; then
  read -ra left <<< "$(grep "^$MARK" "$POLICY" | cut -d: -f2-)"
  rm -f "$POLICY"
  echo "install_packages: removed $POLICY, left by an install that was interrupted"
  keep_from_starting "${left[@]}"
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
[ ${#missing[@]} -gt 0 ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "install_packages: apt packages missing (${missing[*]}); run as root to install them" >&2
  exit 1
fi
# what the install may bring along that was not here (units of those count as scalelab's)
new=("${missing[@]}")
for p in "${!SERVICES[@]}"; do
  case " ${missing[*]} " in *" $p "*) ;; *) installed "$p" || new+=("$p");; esac
done
echo "install_packages: installing ${missing[*]}"
apt-get update -qq
ours=""
if [ ! -e "$POLICY" ]; then  # one that was there before is the machine's: left alone
  printf '#!/bin/sh\n%s %s\nexit 101\n' "$MARK" "${new[*]}" > "$POLICY"
  chmod 755 "$POLICY"; ours=1
  # a failed or interrupted install: what it put in place is kept from starting all the same
  trap 'keep_from_starting "${new[@]}"; rm -f "$POLICY"' EXIT
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
keep_from_starting "${new[@]}"
[ -z "$ours" ] || { rm -f "$POLICY"; trap - EXIT; }
