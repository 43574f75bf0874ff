"""slurmtel's HTML pages (DESIGN §12), served by `slurmtel serve` beside the read API."""
