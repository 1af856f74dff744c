"""Orchestrators that write results/: Table 1 of the RoPE allocation study (``table1``)."""
