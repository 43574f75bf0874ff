#!/bin/bash
# build-chroot.sh SUITE|VERSION [--rebuild]
# Make sure /srv/slurmtel-SUITE is a complete chroot with the lab packages; reuse it when it is.
#   trixie|24.11, sid|26.05. Needs root and the Debian mirror (deb.debian.org), as apt does.
# The chroot is built under ROOT.build and renamed to ROOT only when every step worked, and
# READY (written last) names the packages: a half-built chroot is never used, it is rebuilt.
# Adapted from ../shared/slurm-lab-newer (README "Rebuild from scratch", chroot-install.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
. "$HERE/lab.sh" "${1:?usage: build-chroot.sh trixie|24.11|sid|26.05 [--rebuild]}"
REBUILD=0; [ "${2:-}" = --rebuild ] && REBUILD=1
MIRROR=${SLURMTEL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PKGS="munge slurmctld slurmd slurmdbd slurm-client mariadb-server libfaketime procps"
T0=$(date +%s)
log() { echo "[build $SUITE $(( $(date +%s) - T0 ))s] $*"; }
[ "$(id -u)" = 0 ] || die "run as root"
# one build per chroot at a time (CI starts one in the background, up.sh asks again): the second
# waits here and then finds the chroot complete
mkdir -p "$(dirname "$ROOT")"
exec 9> "$ROOT.lock"
flock 9

# /usr/sbin/slurmctld is an absolute symlink (update-alternatives): test it inside the chroot,
# never through the host's /etc/alternatives
has_slurmctld() { [ -d "$1" ] && chroot "$1" test -x /usr/sbin/slurmctld; }

if [ $REBUILD = 0 ] && has_slurmctld "$ROOT" && [ "$(cat "$READY" 2>/dev/null)" = "$PKGS" ]; then
  log "reusing $ROOT ($(chroot "$ROOT" dpkg-query -W -f='${Version}' slurmctld))"
  exit 0
fi
holder_alive && die "the lab in $ROOT is running: down.sh $SUITE first"

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  # bookworm's 1.0.128+nmu2+deb12u2 knows trixie and sid
  # two builds may start together: wait for the other's dpkg lock instead of failing
  apt_get() { DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 "$@"; }
  apt_get install -y -qq --no-install-recommends debootstrap >/dev/null \
    || { apt_get update -qq && apt_get install -y -qq --no-install-recommends debootstrap >/dev/null; } \
    || die "cannot install debootstrap"
fi

BUILD=$ROOT.build
rm -rf "$BUILD"
log "debootstrap $SUITE into $BUILD"
debootstrap --variant=minbase "$SUITE" "$BUILD" "$MIRROR" > "$BUILD.log" 2>&1 \
  || { tail -20 "$BUILD.log" >&2; die "debootstrap failed (log: $BUILD.log)"; }
# The mirror may be a frozen snapshot whose Release file is past Valid-Until: apt-get update in
# the chroot then fails "Release file ... is expired" (debootstrap itself does not check it).
# Only inside the chroot, never on the host; the signatures are still verified.
echo 'Acquire::Check-Valid-Until "false";' > "$BUILD/etc/apt/apt.conf.d/99no-valid-until"
# maintainer scripts must never start daemons: the chroot's own policy-rc.d
printf '#!/bin/sh\nexit 101\n' > "$BUILD/usr/sbin/policy-rc.d"; chmod 755 "$BUILD/usr/sbin/policy-rc.d"
log "apt-get install $PKGS"
# a private mount namespace: the /proc, /sys, /dev/pts mounts never appear on the host and
# vanish with the namespace
unshare --mount --propagation private bash -c '
  set -e; R='"$BUILD"'
  mount -t proc proc "$R/proc"; mount -t sysfs -o ro sysfs "$R/sys"
  mount -t devpts devpts "$R/dev/pts"; mount -t tmpfs tmpfs "$R/dev/shm"
  chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    bash -c "apt-get update -qq && apt-get install -y -q --no-install-recommends '"$PKGS"' && apt-get clean"' \
  >> "$BUILD.log" 2>&1 || { tail -20 "$BUILD.log" >&2; die "apt-get in the chroot failed (log: $BUILD.log)"; }
has_slurmctld "$BUILD" || die "no slurmctld in $BUILD after apt-get"
rm -rf "$ROOT"
mv "$BUILD" "$ROOT"
echo "$PKGS" > "$READY"
log "built $ROOT: slurm $(chroot "$ROOT" dpkg-query -W -f='${Version}' slurmctld), mariadb $(chroot "$ROOT" dpkg-query -W -f='${Version}' mariadb-server)"
