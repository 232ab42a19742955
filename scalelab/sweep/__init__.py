"""Sweeps: what the user asked for (spec), the runs it expands to (planner), how long they take
(estimate)."""
