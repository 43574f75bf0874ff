#!/bin/bash
# Bring up a single-host Slurm 22.05 lab (Debian 12) with accounting:
#   munged, MariaDB, slurmdbd, slurmctld, two slurmd (gpu01, gpu02; 4 fake H100 each).
# Idempotent: installs what is missing, (re)writes configs, starts only what is not running.
# Run as root. No systemd needed. Stop with down.sh (pidfiles only).
# Adapted from the proven recipe in ../shared/slurm-lab (see README.md here).
#
# Env knobs:
#   SLURMLAB_NO_ACCOUNTS=1  skip creating unix users / sacctmgr accounts
#   SLURMLAB_CGROUP=auto|1|0  task/cgroup (cgroup v1) for real OUT_OF_MEMORY; auto = if /sys/fs/cgroup/memory is writable
#   SLURMLAB_EPILOG_CTLD=0  leave out slurmtel's EpilogSlurmctld hook (installed by default)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF="$HERE/conf"
CTLD_HOST="$(hostname -s)"
NODES=(gpu01 gpu02)
T0=$(date +%s)

log() { echo "[up $(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[up] ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "run as root"
# Never touch a Slurm that is not a lab: an existing /etc/slurm/slurm.conf must be one that
# up.sh (or ../shared/slurm-lab) wrote, else this is a real cluster's head node.
if [ -e /etc/slurm/slurm.conf ] && ! grep -qE '^# slurmtel (integration )?lab' /etc/slurm/slurm.conf; then
  echo "refusing: /etc/slurm/slurm.conf is not a slurmtel lab config (a real Slurm lives here)" >&2; exit 2
fi

# pid_alive PIDFILE COMM -> 0 if the pid in PIDFILE is alive and its comm matches
pid_alive() {
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(cat /proc/$pid/comm 2>/dev/null)" = "$comm" ]
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD...
  local t=$1 what=$2; shift 2
  for ((i = 0; i < t * 4; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.25
  done
  die "timed out after ${t}s waiting for: $what"
}

# ---------------------------------------------------------------- 1. packages
# (the package list and the policy-rc.d care live in scripts/ci-slurm-deps.sh, shared with CI)
"$HERE/../../scripts/ci-slurm-deps.sh" || die "installing the Debian packages failed"
log "packages ok ($(dpkg-query -W -f='${Version}' slurmctld))"

# ---------------------------------------------------------------- 2. dirs, devices, configs
install -d -o slurm -g slurm -m 755 /run/slurm /var/log/slurm /var/spool/slurm /var/spool/slurm/ctld
for n in "${NODES[@]}"; do install -d -m 755 "/var/spool/slurm/d-$n"; done
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
install -d -o mysql -g root -m 755 /run/mysqld
for i in 0 1 2 3 4 5 6 7; do
  [ -e "/dev/fakegpu$i" ] || mknod -m 666 "/dev/fakegpu$i" c 1 3   # same major/minor as /dev/null
done

install -d -m 755 /etc/slurm
# SlurmctldHost and DbdHost must equal `hostname -s`, else the daemons refuse to start
# ("not a valid controller")
sed "s/@CTLD_HOST@/$CTLD_HOST/g" "$CONF/slurm.conf.in" > /etc/slurm/slurm.conf.new
# SLURMLAB_CGROUP: auto (default) = use task/cgroup when a writable cgroup v1 memory hierarchy exists,
# 1 = force, 0 = never (then OverMemoryKill polling is used and OOM jobs end FAILED, not OUT_OF_MEMORY)
CG=${SLURMLAB_CGROUP:-auto}
if [ "$CG" = auto ]; then
  if [ -w /sys/fs/cgroup/memory/cgroup.procs ] && [ -d /sys/fs/cgroup/memory ]; then CG=1; else CG=0; fi
fi
if [ "$CG" = 1 ]; then
  # memory enforcement through cgroup v1 => real OUT_OF_MEMORY job states
  # (with cgroup v1 the hierarchy is per node: /sys/fs/cgroup/memory/slurm_gpu01)
  sed -i 's|^TaskPlugin=.*|TaskPlugin=task/cgroup|; s|^JobAcctGatherParams=.*|#&|' /etc/slurm/slurm.conf.new
  install -m 644 "$CONF/cgroup.conf" /etc/slurm/cgroup.conf
else
  rm -f /etc/slurm/cgroup.conf
fi
install -m 644 "$CONF/gres.conf" /etc/slurm/gres.conf
# EpilogSlurmctld: slurmtel's job-ended hook (systemd/slurmtel-epilog.sh), installed where the
# README tells a site to. slurmctld runs it as SlurmUser; it posts to a daemon at 127.0.0.1:9768
# (its default, no /etc/slurmtel/epilog.conf here) with a MUNGE credential, and when nothing
# listens there (every test but tests/integration/test_slurm_freshness.py) it exits 0 at once.
# Only this lab: the newer labs' slurm.conf is made from slurm.conf.in without it.
if [ "${SLURMLAB_EPILOG_CTLD:-1}" = 1 ]; then
  install -D -m 755 "$HERE/../../systemd/slurmtel-epilog.sh" /usr/local/libexec/slurmtel-epilog.sh
  echo "EpilogSlurmctld=/usr/local/libexec/slurmtel-epilog.sh" >> /etc/slurm/slurm.conf.new
fi
sed "s/@CTLD_HOST@/$CTLD_HOST/g" "$CONF/slurmdbd.conf.in" > /etc/slurm/slurmdbd.conf.new
chown slurm:slurm /etc/slurm/slurmdbd.conf.new; chmod 600 /etc/slurm/slurmdbd.conf.new
mv -f /etc/slurm/slurmdbd.conf.new /etc/slurm/slurmdbd.conf
chmod 644 /etc/slurm/slurm.conf.new
SLURM_CONF_CHANGED=0
cmp -s /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf || SLURM_CONF_CHANGED=1
mv -f /etc/slurm/slurm.conf.new /etc/slurm/slurm.conf
# only for a MariaDB that up.sh starts; an image may ship its own my.cnf without the conf.d dir
if [ -d /etc/mysql/mariadb.conf.d ]; then
  install -m 644 "$CONF/mariadb-slurmlab.cnf" /etc/mysql/mariadb.conf.d/60-slurmlab.cnf
fi

# ---------------------------------------------------------------- 3. munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating munge key"
  mungekey --create --keyfile=/etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
if ! pid_alive /run/munge/munged.pid munged; then
  log "starting munged"
  # munged has to run as the munge user; it daemonizes and writes its own pidfile
  runuser -u munge -- /usr/sbin/munged
fi
wait_for 20 "munge round trip" bash -c 'munge -n | unmunge'

# ---------------------------------------------------------------- 4. mariadb
# A MariaDB that already answers (some machines start one before the session) is used as it
# is and left running by down.sh; only one started here is marked as ours.
if mariadb -uroot -e 'select 1' >/dev/null 2>&1; then
  log "using the MariaDB that is already running"
elif ! pid_alive /run/mysqld/mysqld.pid mariadbd; then
  [ -d /var/lib/mysql/mysql ] || { log "initialising mariadb datadir"; mariadb-install-db --user=mysql >/dev/null; }
  log "starting mariadbd"
  # mariadbd does not daemonize itself: nohup + --pid-file, stopped by down.sh via that pidfile
  nohup /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid \
    >>/var/log/slurm/mariadbd.out 2>&1 </dev/null &
  touch /run/slurm-lab-started-mariadb
fi
wait_for 60 "mariadb socket" mariadb -uroot -e 'select 1'
mariadb -uroot <<'SQL'
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmlab';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL

# ---------------------------------------------------------------- 5. slurmdbd
if ! pid_alive /run/slurm/slurmdbd.pid slurmdbd; then
  log "starting slurmdbd"
  /usr/sbin/slurmdbd
fi
wait_for 60 "sacctmgr answers" sacctmgr -n show cluster
if ! sacctmgr -n -P show cluster format=cluster | grep -qx lab; then
  sacctmgr -i add cluster lab >/dev/null
fi

# ---------------------------------------------------------------- 6. slurmctld + slurmd x2
if ! pid_alive /run/slurm/slurmctld.pid slurmctld; then
  log "starting slurmctld"
  /usr/sbin/slurmctld
elif [ $SLURM_CONF_CHANGED = 1 ]; then
  log "slurm.conf changed: scontrol reconfigure"
  scontrol reconfigure || true
fi
wait_for 60 "slurmctld ping" bash -c 'scontrol ping | grep -q "is UP"'
for n in "${NODES[@]}"; do
  if ! pid_alive "/run/slurm/slurmd-$n.pid" slurmd; then
    log "starting slurmd -N $n"
    # multiple-slurmd: NodeHostname=localhost, per-node Port, %n in the spool/pid/log paths
    /usr/sbin/slurmd -N "$n"
  fi
done
# nodes that were left DOWN/DRAIN by an earlier run: resume them
sleep 0.5
for n in "${NODES[@]}"; do
  st=$(sinfo -h -n "$n" -o '%T' | head -1)
  case "$st" in down*|drain*|fail*) scontrol update nodename="$n" state=resume 2>/dev/null || true ;; esac
done
wait_for 90 "both nodes idle/alloc/mix in sinfo" bash -c \
  '[ "$(sinfo -h -N -o "%N %T" | sort -u | grep -cE " (idle|mixed|allocated)$")" -ge 2 ]'

# ---------------------------------------------------------------- 7. users, accounts, associations
if [ "${SLURMLAB_NO_ACCOUNTS:-0}" != 1 ]; then
  declare -A ACCT=([alice]=physics [bob]=chemistry [carol]=biology)
  for u in alice bob carol; do
    id "$u" >/dev/null 2>&1 || useradd -m -s /bin/bash "$u"
  done
  have_acct() { sacctmgr -n -P show account "$1" format=account | grep -qx "$1"; }
  for a in physics chemistry biology; do
    have_acct "$a" || sacctmgr -i add account "$a" cluster=lab parent=root description="$a dept" organization=university >/dev/null
  done
  for u in alice bob carol; do
    sacctmgr -n -P show assoc where user="$u" account="${ACCT[$u]}" format=user | grep -qx "$u" \
      || sacctmgr -i add user "$u" account="${ACCT[$u]}" defaultaccount="${ACCT[$u]}" cluster=lab >/dev/null
  done
  # alice also may charge chemistry (second association, non-default)
  sacctmgr -n -P show assoc where user=alice account=chemistry format=user | grep -qx alice \
    || sacctmgr -i add user alice account=chemistry cluster=lab >/dev/null
  # slurmctld caches associations; make sure it sees them before returning
  wait_for 30 "slurmctld knows alice" bash -c 'scontrol show assoc_mgr users=alice flags=assoc | grep -q "UserName=alice"'
fi

log "task plugin: $(scontrol show config | awk '/^TaskPlugin /{print $3}')"
log "up: $(sinfo -h -o '%P %a %D %T' | tr '\n' ';')  total $(( $(date +%s) - T0 ))s"
