"""Run under horovodrun -np 2: the workload's Horovod helpers on a channels_last model.

Each rank starts from its own weights and input. After engines.broadcast_parameters every rank
holds rank 0's weights, still channels_last; after one step of hvd.DistributedOptimizer with
engines.contiguous(compression) each gradient is the mean of the ranks' own gradients. Without
the wrapper Horovod refuses the same gradients. Prints CHECKED <compression> per check passed.
"""

import sys

import horovod.torch as hvd
import torch

sys.path.insert(0, sys.argv[1])
import engines  # noqa: E402

hvd.init()
rank = hvd.rank()
last = torch.channels_last


def model_of(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten()).to(memory_format=last)


model = model_of(100 + rank)
engines.broadcast_parameters(hvd, model)
weight = model[0].weight
assert weight.is_contiguous(memory_format=last) and not weight.is_contiguous()
assert torch.equal(weight, model_of(100)[0].weight), "rank 0's weights did not arrive"
print("CHECKED broadcast", flush=True)

x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5) * (rank + 1) / 100
x = x.contiguous(memory_format=last)
own = torch.autograd.grad(model(x).square().sum(), weight)[0]
mean = hvd.allgather(own.contiguous().unsqueeze(0)).mean(0)  # each rank's own gradient, averaged

for name, comp, tol in (("none", hvd.Compression.none, 1e-6), ("fp16", hvd.Compression.fp16, 2e-3)):
    fresh = model_of(100)  # rank 0's weights on every rank, and no other optimizer's hooks
    opt = hvd.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.0),
                                   named_parameters=[(f"{name}.{k}", v) for k, v in
                                                     fresh.named_parameters()],
                                   compression=engines.contiguous(comp), op=hvd.Average)
    fresh(x).square().sum().backward()
    opt.synchronize()
    grad = fresh[0].weight.grad
    torch.testing.assert_close(grad, mean, rtol=tol, atol=tol * mean.abs().max().item())
    print(f"CHECKED {name}", flush=True)

fresh = model_of(100)
opt = hvd.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.0),
                               named_parameters=[(f"plain.{k}", v) for k, v in
                                                 fresh.named_parameters()])
try:
    fresh(x).square().sum().backward()
    opt.synchronize()
except Exception as exc:  # Horovod's own refusal, as the workload met it before the wrapper
    assert "contiguous" in str(exc), exc
    print("CHECKED plain-refused", flush=True)
