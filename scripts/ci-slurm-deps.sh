#!/bin/bash
# Install the Debian 12 packages that the real-Slurm integration suite (tests/slurm_lab) needs,
# when any is missing. Idempotent and quiet when everything is there. Run as root.
#   scripts/ci-slurm-deps.sh                  install what is missing
#   scripts/ci-slurm-deps.sh --check          exit 1 (and list them) when packages are missing
#   scripts/ci-slurm-deps.sh [--check] PKG..  only these packages: `munge` (the MUNGE tests:
#                                             tests/munge_lab.py), `prometheus openssl` (the
#                                             prometheus source's tests: tests/prometheus_server.py),
#                                             `victoria-metrics` (the sample store's tests),
#                                             `chromium chromium-driver` (the page tests:
#                                             tests/test_pages.py)
#
# tests/slurm_lab/up.sh and force-rollup.sh call this too, so CI may run it up front (to keep the
# apt time out of the test timings) or leave it to the tests.
set -euo pipefail

# slurm 22.05 daemons and clients, MariaDB for slurmdbd, libfaketime for force-rollup.sh
# (munge also for the authentication tests, which start munged daemons of their own)
PKGS=(munge slurmctld slurmd slurmdbd slurm-client mariadb-server libfaketime)
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
if [ $# -gt 0 ]; then PKGS=("$@"); fi

die() { echo "[slurm-deps] ERROR: $*" >&2; exit 1; }

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ $check = 1 ]; then
  [ ${#missing[@]} -eq 0 ] || { echo "missing: ${missing[*]}"; exit 1; }
  exit 0
fi
[ ${#missing[@]} -gt 0 ] || exit 0

[ "$(id -u)" = 0 ] || die "run as root to install: ${missing[*]}"
[ -r /etc/debian_version ] && command -v apt-get >/dev/null || die "not a Debian system (no apt-get)"

echo "[slurm-deps] installing: ${missing[*]}"
# Keep the maintainer scripts from trying to start services (no init system here). Only when no
# policy-rc.d exists: container images ship their own, which must never be overwritten.
tmp_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; tmp_policy=1
fi
cleanup() { if [ $tmp_policy = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

install_pkgs() {
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
# without lists (fresh image) update first; with stale lists (a .deb vanished from the mirror)
# the first install fails, so update and try once more
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]; then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
fi
if ! install_pkgs; then
  echo "[slurm-deps] install failed; apt-get update and retry"
  apt-get -o DPkg::Lock::Timeout=300 update -qq || die "apt-get update failed"
  install_pkgs || die "apt-get install ${missing[*]} failed"
fi
echo "[slurm-deps] installed: $(dpkg-query -W -f='${Package} ${Version}\n' "${missing[@]}" | tr '\n' ' ')"
