"""Who is asking, for slurmtel's HTTP servers: MUNGE credentials, Slurm JWTs and a trusted
proxy's user header, deny by default (DESIGN §8). `identity.authenticate` is the one entry
point; the modules beside it are pure apart from running munge/unmunge. No database code.
"""
