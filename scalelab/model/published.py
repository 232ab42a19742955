"""Published multi-node data-parallel scaling tables, and scalelab's model scored against them.

The ResNet points at 32 GPUs or fewer of the tables in docs/dev/published-scaling-tables.md
that state their network, set up as published (model, precision, batch per GPU, GPUs per node,
nodes, line rate and fabric, Horovod's fusion threshold of the time, the table's own single-GPU
images/s). Left out: points above 32 GPUs (T2, T3); Inception-V3 and VGG-16 (no profile of
those architectures); T6, a TCP path its own authors found misconfigured (an overlay network,
no placement group); T7, whose one-node point (4 GPUs) is not the layout of its multi-node one
(2 x 8). The overlap model predicts each point from the shipped V100 profile with its layer
times scaled to the table's single-GPU rate, so the scaling is predicted, not the single-GPU
speed; the one column that takes anything else from a table is the GPU-side cost, 1 / the
efficiency of the table's own one-node point. bench/perf/published_check.py prints the
comparison; the report states its summary beside the what-if table.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from scalelab.model import accel, bucket_model, fabric
from scalelab.model.networks import MODELS

AIM_POINTS = 10.0
# inside a node: what an allreduce among its GPUs achieves (Mbit/s of bus bandwidth)
INTRA = {name: link.mbit for name, link in fabric.INTRA_LINKS.items()}


@dataclass(frozen=True)
class Point:
    table: str
    model: str
    precision: str  # fp32 or amp (the tables' fp16 mixed precision)
    batch: int  # per GPU
    gpus_per_node: int
    nodes: int
    line_gbit: float
    intra: str
    single_ips: float  # the table's own one-GPU images/s
    published: float  # efficiency
    base_gpus: int  # the table's efficiency is relative to this many GPUs (1, or one node)
    fusion_mb: float  # Horovod's fusion threshold of the time
    one_node: float | None = None  # the table's own efficiency of one node of G GPUs
    note: str = ""
    # what the model leaves out that this point's setup has (said where the point misses)
    missing: str = ""
    fabric: str = "ethernet-tcp"  # the profile of the table's network (bench/fabrics/)


# Horovod 0.9-0.15 fused up to 64 MB (HOROVOD_FUSION_THRESHOLD's default before 0.21)
POINTS = [
    # T1: Horovod README (2017-09-05), 4 servers x 4 Pascal GPUs, 25 Gbit/s, TCP with NCCL
    Point("T1 Horovod README, 25GbE TCP", "resnet101", "fp32", 64, 4, 4, 25, "pcie3",
          119.4, 0.882, 1, 64.0, None, "no one-node point; Pascal model not named",
          "the GPU-side cost: no one-node point to take it from (4 Pascal GPUs on one PCIe "
          "root, NCCL 2.0 staging through the host)"),
    # T4: horovod issue 779, p3.16xlarge (8 V100 NVLink), 25 Gbit/s TCP, synthetic data
    Point("T4 horovod#779, p3.16xlarge 25GbE", "resnet50", "amp", 256, 8, 2, 25, "nvlink-v100",
          872.0, 0.919, 1, 64.0, 0.957, "fp16, batch 256 inferred (872 img/s per V100)"),
    Point("T4 horovod#779, p3.16xlarge 25GbE", "resnet50", "amp", 256, 8, 4, 25, "nvlink-v100",
          872.0, 0.855, 1, 64.0, 0.957, "fp16, batch 256 inferred"),
    # the same user's real-data run (horovod issue 871), efficiency relative to one node
    Point("T4' horovod#871, real data", "resnet50", "amp", 256, 8, 2, 25, "nvlink-v100",
          750.3, 0.924, 8, 64.0, None, "ImageNet on FSx; relative to one node"),
    Point("T4' horovod#871, real data", "resnet50", "amp", 256, 8, 4, 25, "nvlink-v100",
          750.3, 0.7788, 8, 64.0, None, "ImageNet on FSx; relative to one node",
          "the input pipeline: 32 GPUs reading ImageNet from one shared file system, which "
          "the same cluster did not lose on synthetic data (T4, 4 x 8)"),
    # T5: aws-samples/deep-learning-models issue 2, p3.16xlarge, hierarchical allreduce, 16 MB
    Point("T5 aws-samples#2, p3.16xlarge 25GbE", "resnet50", "amp", 256, 8, 2, 25,
          "nvlink-v100", 740.0, 0.83, 1, 16.0, 0.845, "published 83 %; fp16 inferred"),
    Point("T5 aws-samples#2, p3.16xlarge 25GbE", "resnet50", "amp", 256, 8, 4, 25,
          "nvlink-v100", 740.0, 0.899, 1, 16.0, 0.845, "derived; above its own 16-GPU point"),
    # RDMA. T1's RDMA row: the same 16 Pascal GPUs, RoCE on the same 25 Gbit/s network
    Point("T1 Horovod README, 25GbE RoCE", "resnet101", "fp32", 64, 4, 4, 25, "pcie3",
          119.4, 0.914, 1, 64.0, None, "no one-node point; Pascal model not named",
          "the GPU-side cost: no one-node point to take it from", "rdma"),
    # T8: horovod issue 288, 2 x Dell C4140 (4 V100 SXM2, NVLink), EDR InfiniBand 100 Gbit/s
    Point("T8 horovod#288, C4140 EDR IB", "resnet50", "amp", 128, 4, 2, 100, "nvlink-v100",
          641.0, 0.8619, 1, 64.0, 0.928, "fp16 inferred (641 img/s per V100); batch 128 as "
          "in the issue's first run", "", "rdma"),
    # T9: horovod issue 476, 2 x 8 GPUs on InfiniBand, ResNet-101 batch 64 fp32 (issue 466)
    Point("T9 horovod#476, 2x8 IB", "resnet101", "fp32", 64, 8, 2, 100, "pcie3", 195.64,
          0.755, 1, 64.0, 0.762, "GPU model and link rate not stated (EDR assumed); "
          "ResNet-101 batch 64 from the same user's issue 466", "", "rdma"),
]


def device_doc(p: Point) -> dict:
    """The shipped V100 profile for the point's model and precision at its batch, every time
    scaled so that one GPU trains at the table's own images/s."""
    doc = accel.resolve("v100", p.model, p.precision, p.batch, MODELS[p.model].image_size)
    want = p.batch / p.single_ips
    f = want / accel.step_s(doc)
    return {**doc, "optimizer_s": doc["optimizer_s"] * f,
            "layers": [{**ly, "fwd_s": ly["fwd_s"] * f, "bwd_s": ly["bwd_s"] * f}
                       for ly in doc["layers"]]}


def step_s(doc: dict, p: Point, nodes: int, fab: fabric.Fabric | None,
           stretch: float = 1.0) -> float:
    """One step of `nodes` x G GPUs: the ring's slowest link sets its pace, the NIC between
    nodes (line x share) or the intra-node path on one node; per-hop latency from the
    profile (50 us on the ideal fabric, scalelab's default). stretch: the GPU-side cost."""
    world = nodes * p.gpus_per_node
    line = p.line_gbit * 1000.0
    if nodes <= 1:
        link = INTRA[p.intra]
    else:
        link = fab.collective_mbit(line, p.gpus_per_node) if fab else line
    alpha = fab.per_hop_latency_s if fab else 50e-6
    return bucket_model.predict_step_s(doc, "horovod", world, link, p.precision, alpha, p.fusion_mb,
                                  gpu_stretch=stretch)


def efficiency(p: Point, fab: fabric.Fabric | None, stretch: float = 1.0) -> float:
    """throughput(W) / (W / W0 x throughput(W0)) with a fixed batch per GPU, which is
    step(W0) / step(W); W0 is the table's base (one GPU, or one node)."""
    doc = device_doc(p)
    if p.base_gpus > 1:
        base = step_s(doc, p, max(1, p.base_gpus // p.gpus_per_node), fab, stretch)
    else:
        base = bucket_model.predict_step_s(doc, "horovod", 1, math.inf, p.precision)
    return base / step_s(doc, p, p.nodes, fab, stretch)




def best(p: Point) -> float:
    """The point's one prediction: on its fabric profile, with the GPU-side cost of its
    table's one-node point where the table has one."""
    fab = fabric.load(p.fabric)
    return efficiency(p, fab, 1 / p.one_node) if p.one_node else efficiency(p, fab)


@functools.lru_cache(maxsize=1)
def summary() -> tuple[int, int, float, str]:
    """(points, points within AIM_POINTS, the largest miss in points, what that point's setup
    has that the model leaves out) over every point."""
    misses = [(abs(best(p) - p.published) * 100, p) for p in POINTS]
    worst, at = max(misses, key=lambda m: m[0])
    return (len(misses), sum(m <= AIM_POINTS for m, _ in misses), worst,
            at.missing or "not known")
