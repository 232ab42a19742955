"""Communication settings as scalelab names them: which each engine has, their defaults, and
the one label the progress line, the series key and the report use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the communication settings: DDP's bucket size, Horovod's fusion threshold and cycle time,
# gradient compression. Which engine has each, its run-id tag and what an older store reads
# as are their entries of the settings table (scalelab.sweep.settings)
COMM_KEYS = ("bucket_cap_mb", "fusion_threshold_mb", "cycle_time_ms", "compression")
COMPRESSIONS = ("none", "fp16")
# the engines' own defaults: torch DDP's bucket_cap_mb; Horovod's HOROVOD_FUSION_THRESHOLD
# (128 MB, and HOROVOD_CYCLE_TIME 1 ms, since Horovod 0.21: horovodrun --help of 0.28)
COMM_DEFAULTS: dict[str, Any] = {"bucket_cap_mb": 25.0, "fusion_threshold_mb": 128.0,
                                 "cycle_time_ms": 1.0, "compression": "none"}
COMM_NAMES = {"bucket_cap_mb": "bucket {:g} MB", "fusion_threshold_mb": "fusion {:g} MB",
              "cycle_time_ms": "cycle {:g} ms"}


def comm_label(values: Mapping[str, Any], sep: str = ", ", every: bool = False) -> str:
    """How scalelab names communication settings, the one place it does (the progress line,
    the series key, the report): the settings given that differ from the engine's defaults
    (every=True: all given), then the compression unless none.

    >>> comm_label({"bucket_cap_mb": 50.0, "fusion_threshold_mb": float("nan"),
    ...             "cycle_time_ms": None, "compression": "fp16"})
    'bucket 50 MB, fp16'
    >>> comm_label({"bucket_cap_mb": 25.0, "compression": "none"}), comm_label(
    ...     {"fusion_threshold_mb": 128.0}, every=True)
    ('', 'fusion 128 MB')
    """
    parts = []
    for key, fmt in COMM_NAMES.items():
        v = values.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v == v \
                and (every or float(v) != COMM_DEFAULTS[key]):
            parts.append(fmt.format(float(v)))
    if values.get("compression") not in (None, "", "none"):
        parts.append(str(values["compression"]))
    return sep.join(parts)
