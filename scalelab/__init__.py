"""scalelab: provision clusters, sweep distributed training, report how it scales and why."""

__version__ = "0.1.0"
