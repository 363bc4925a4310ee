"""accord benchmarks: ``python -m benchmarks`` (or ``make bench``) prints and records them."""
