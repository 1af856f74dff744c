"""The experiments: each a package that plans its runs, trains them through the run engine
(``repro.runs``) and writes its tables. ``table1`` (RoPE allocation), ``clapping`` (pipeline
compression) and ``bench`` (speed, communication, memory). Experiments never import each other."""
