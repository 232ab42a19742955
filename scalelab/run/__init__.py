"""Runs: the driver that executes a plan, and what it starts, shapes, probes and reaps."""
