"""``make bench``: the suite's speed, communication and memory against the plain alternatives
(see ``repro.bench.run``)."""
