"""The read API (`slurmtel serve`) and its client (the CLI on a login node)."""
