"""slurmtel-agent, the node agent: NVML samples -> window summaries -> local spool -> HTTP.

Modules: nvml (the only NVML importer, the seam), fake_nvml (the seam from nvidia-smi
captures), sampler, procmap (GPU process -> Slurm job), summarize (pure windows), spool,
server, metrics, token (the /v1/* bearer token), protocol (wire format; the head imports only
this), main (the command).
Importing this package imports nothing else: no NVML, no GPU needed.
"""
