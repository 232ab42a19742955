"""Clusters: where nodes come from (targets), how they are reached (SSH), made ready
(configure, bundle, image) and what they turn out to be (facts)."""
