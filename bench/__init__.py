"""Benchmarks of sdarflow's hot paths against their obvious baselines and the machine's own ceiling."""
