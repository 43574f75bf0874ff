#!/bin/bash
# EpilogSlurmctld hook: tell the slurmtel head daemon that a job ended, so the daemon runs
# sacct daemon.job_end_delay_seconds later and the job's record is stored within a minute.
#
#   slurm.conf:  EpilogSlurmctld=/usr/local/libexec/slurmtel-epilog.sh
#   (with several EpilogSlurmctld programs, call this one from yours)
#
# It never delays slurmctld by more than about one second and never fails the epilog: it
# always exits 0, whatever happens (daemon down, address unreachable, munged down, bad
# config). It sends one HTTP POST over bash's /dev/tcp (no curl, no python), authenticated:
# by default with a MUNGE credential (`munge -s "POST /v1/job-ended <nonce>"`, so it is good
# for this request only and only once; the daemon takes those of root and SlurmUser,
# daemon.job_end_users), or with a bearer token when SLURMTEL_TOKEN_FILE names a file that
# holds daemon.job_end_token_file's token. A post that gets no answer, 429 (rate limited) or
# 5xx (busy, munged down) is tried again in the background, in a session of its own that
# slurmctld does not wait for: after about 0.3, 0.7, 1.5, 3, 6 and 12 s (plus up to a second
# of jitter), each time with a fresh credential, and no more once one is answered.
#
# /etc/slurmtel/epilog.conf, lines KEY=VALUE, all optional:
#   SLURMTEL_DAEMON=host:port        default 127.0.0.1:9768 (daemon.port)
#   SLURMTEL_TOKEN_FILE=/path        bearer token instead of MUNGE (readable by SlurmUser only)
#   SLURMTEL_MUNGE_SOCKET=/path      munged's socket, when not MUNGE's default
# slurmctld runs it as SlurmUser with SLURM_JOB_ID set and no PATH.

PATH=/usr/bin:/bin
exec 2>/dev/null  # nothing of ours in slurmctld's log, not even bash's "Killed"
addr=127.0.0.1:9768
token_file=
socket=
conf=${SLURMTEL_EPILOG_CONF:-/etc/slurmtel/epilog.conf}
if [ -r "$conf" ]; then
    while IFS='=' read -r key value; do
        case $key in
            SLURMTEL_DAEMON) [ -n "$value" ] && addr=$value ;;
            SLURMTEL_TOKEN_FILE) token_file=$value ;;
            SLURMTEL_MUNGE_SOCKET) socket=$value ;;
        esac
    done < "$conf" 2>/dev/null
fi
host=${addr%:*}
port=${addr##*:}
host=${host#[}
host=${host%]}
job=${SLURM_JOB_ID:-}
case $job in *[!0-9]*) job= ;; esac
body="job_id=$job"

# One post; prints the answer's status code (nothing when there is none). timeout -s KILL:
# munge and the connect to a host that drops packets are cut after 1 s, whatever bash does.
# The token is read inside (never an argument: others see arguments).
attempt() {
    timeout -s KILL 1 bash -c '
        if [ -n "$4" ]; then
            read -r token < "$4" || exit 0
            auth="Bearer $token"
        else
            read -r nonce < /proc/sys/kernel/random/uuid || exit 0
            cred=$(munge ${5:+-S "$5"} -s "POST /v1/job-ended $nonce" </dev/null) || exit 0
            auth="MUNGE $cred"
        fi
        exec 3<>"/dev/tcp/$1/$2" || exit 0
        printf "POST /v1/job-ended HTTP/1.0\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" "$1" "$auth" "${#3}" "$3" >&3
        read -r -t 1 _version code _rest <&3 && printf "%s" "$code"
    ' slurmtel-epilog "$host" "$port" "$body" "$token_file" "$socket" </dev/null 2>/dev/null
}

# what may pass later: no answer, 429, 5xx; an accepted or refused post (2xx, other 4xx) is done
worth_retrying() {
    case $1 in
        429 | 5[0-9][0-9] | "") return 0 ;;
        *) return 1 ;;
    esac
}

if [ -z "${SLURMTEL_EPILOG_RETRYING:-}" ]; then
    code=$(attempt)
    if worth_retrying "$code"; then
        # the retries in a session of their own, nothing of slurmctld's held open
        export SLURMTEL_EPILOG_RETRYING=1
        if [ -x /usr/bin/setsid ] || [ -x /bin/setsid ]; then
            setsid bash "$0" </dev/null >/dev/null 2>&1 &
        else
            bash "$0" </dev/null >/dev/null 2>&1 &
        fi
    fi
    exit 0
fi
for delay in 0.3 0.7 1.5 3 6 12; do
    sleep "$delay"
    sleep "0.$((RANDOM % 10))"
    code=$(attempt)
    worth_retrying "$code" || exit 0
done
exit 0
