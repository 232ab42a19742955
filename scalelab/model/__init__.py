"""What scalelab knows without running anything: devices, fabrics, models, communication
settings, and the models of how training scales (ring, overlap, stragglers, verdicts)."""
