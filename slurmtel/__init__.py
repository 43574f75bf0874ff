"""slurmtel: Slurm accounting and GPU telemetry in PostgreSQL."""

__version__ = "0.1.0"
