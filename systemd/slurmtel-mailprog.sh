#!/bin/sh
# Slurm's MailProg: job-end mails become slurmtel's job summaries (the job_end rule of
# [actions]: the figures and advice of `slurmtel job`, its cost, a link to its page), sent once
# the job's accounting record and last telemetry are in; every other mail (job began, time
# limit, array summaries ...), and a job-end mail when slurmtel cannot record it, goes to
# actions.mailprog.fallback_command (default /usr/bin/mail) exactly as Slurm handed it over.
#
#   slurm.conf:  MailProg=/usr/local/sbin/slurmtel-mailprog
#
# slurmctld runs it as SlurmUser: `MailProg -s SUBJECT RECIPIENT`, with SLURM_JOB_ID,
# SLURM_JOB_MAIL_TYPE and SLURM_CLUSTER_NAME set (Slurm 21.08+). SlurmUser must be able to read
# the config and reach the database (database.url_file readable by it, or a role of its own).
exec /usr/bin/slurmtel --config "${SLURMTEL_CONFIG:-/etc/slurmtel/slurmtel.toml}" mailprog "$@"
