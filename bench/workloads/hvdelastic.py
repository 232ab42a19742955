"""Horovod's ranks under its elastic driver (resnet.py --engine horovod --restartable, started
by horovodrun with --min-np): how a run comes back when one node's ranks are killed.

Horovod keeps a run's state in memory (where the state is: a GPU's copy stays on it), not on
disk. The ranks commit it (weights, buffers, the optimizer's state, the step) at every
checkpoint step, beside the checkpoint written to disk, and once before the first step. When a node's ranks die, the others' next collective
fails (HorovodInternalError): they roll back to the last commit, leave Horovod and join it
again without the failed node. horovodrun's driver blacklists that node, takes it back once
its cooldown ends, and starts its ranks there afresh; the others, waiting at the committed
step, join Horovod once more with them, and the returning ranks receive the committed state
from rank 0 (a rank that survived: the driver gives the returning node the last ranks) by
broadcast. Every rank then trains on from the committed step to the run's last.

An attempt's record is ckpt.resume's under DDP: restart (the failures this run came back
from, the same on every rank), from_step, load_s (a surviving rank: its roll-back and the
broadcast; a returning one: the broadcast), and when the attempt's process began (a
surviving rank: when it caught the failure), joined Horovod again, and was ready to train.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

NOTICE_S = 10.0  # how long the ranks wait for the driver's word that the node is back


def train(hvd: Any, model: Any, optimizer: Any, eng: Any, timeline: dict[str, float],
          emulated: bool, loop: Callable[[], Any]) -> Any:
    """Run loop (the warm-up and timed steps from eng.begin, then the result's gather) under
    Horovod's elastic driver until it finishes; its result. eng.commit is set to commit the
    state after a step; eng.attempt to the attempt's record after each failure. An emulated
    rank's optimizer takes no step and has no state to keep."""
    import horovod.torch.elastic as elastic
    from horovod.common.exceptions import HostsUpdatedInterrupt

    state = _state_class()(hvd, model, optimizer, not emulated)
    world, seen = hvd.size(), [0]

    def commit(step: int) -> float:
        t0 = time.perf_counter()
        state.step = step
        state.commit()
        eng.clock.sync()  # a device's copies are done before they are counted
        return time.perf_counter() - t0

    eng.commit = commit

    @elastic.run
    def attempt(st: Any) -> Any:
        # The driver first goes on without the failed node (its --min-np), then takes it back
        # when its blacklisting cools down and tells rank 0 so: the ranks wait for that, at
        # the committed step, and train at the run's full size only. (With --min-np at the
        # full size, horovodrun 0.28 counts the failed node's slot as still running and never
        # starts its ranks again.) Its word is dropped if it comes while the ranks are still
        # joining Horovod; after NOTICE_S without it they join again all the same, and the
        # driver then gives them every node it has back.
        t0 = time.monotonic()
        while hvd.size() < world:
            time.sleep(0.05)
            st.check_host_updates()  # raises once the node is back: Horovod is joined again
            if hvd.broadcast_object(time.monotonic() - t0 > NOTICE_S, root_rank=0):
                raise HostsUpdatedInterrupt(False)
        t_synced = time.time()
        if st.restart != seen[0]:  # a failure since the last time: this attempt's record
            seen[0] = st.restart
            eng.attempt = {"restart": st.restart, "from_step": st.step,
                           "load_s": round(st.rolled_s + st.synced_s, 6),
                           "process_at": st.caught_at or timeline["process"],
                           "rendezvous_at": st.joined_at or timeline["rendezvous"],
                           "ready_at": t_synced}
            if eng.ckpt is not None:
                eng.ckpt.saved = []  # the figures are the last attempt's, as a DDP restart's
        eng.begin = st.step  # the committed step, also after a reset without a failure
        timeline["ready"] = t_synced
        return loop()

    return attempt(state)


def _state_class() -> type:
    """Kept, as a subclass of horovod.common.elastic.State (imported only where Horovod is)."""
    from engines import broadcast_parameters
    from horovod.common.elastic import State

    class Kept(State):
        """The state Horovod's elastic driver rolls back to and hands to returning ranks:
        model and optimizer state, the step after which it was committed, the failures so far.
        Broadcast as resnet.py's own start does (engines.broadcast_parameters, which copes with
        channels_last weights); the optimizer's state first, since Horovod makes an empty one
        by a zero-gradient step, which weight decay would move the weights by."""

        def __init__(self, hvd: Any, model: Any, optimizer: Any, keep_optim: bool) -> None:
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)
            self.hvd, self.model, self.optimizer = hvd, model, optimizer
            self.keep_optim = keep_optim
            self.step, self.restart = 0, 0
            self.caught_at: float | None = None  # when this rank caught the failure
            self.joined_at: float | None = None  # when it was in Horovod again
            self.rolled_s = self.synced_s = 0.0
            self.save()

        def save(self) -> None:
            self._kept = ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                          copy.deepcopy(self.optimizer.state_dict()) if self.keep_optim
                          else None, self.step)

        def restore(self) -> None:
            """After a failure: back to the last commit, and one restart more (ranks that
            come back get the count in sync)."""
            self.caught_at = time.time()
            self.restart += 1
            t0 = time.perf_counter()
            weights, optim, self.step = self._kept
            self.model.load_state_dict(weights)
            # which also drops Horovod's handles and counts of the step the failure cut short
            self.optimizer.load_state_dict(optim if optim is not None
                                           else self.optimizer.state_dict())
            self.rolled_s = time.perf_counter() - t0

        def reset(self) -> None:
            """In Horovod again (the last time: with the node that came back)."""
            self.joined_at = time.time()

        def sync(self) -> None:
            t0 = time.perf_counter()
            if self.keep_optim:
                self.hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
            broadcast_parameters(self.hvd, self.model)
            self.step, self.restart = self.hvd.broadcast_object((self.step, self.restart),
                                                                root_rank=0)
            self.synced_s = time.perf_counter() - t0
            self.save()

    return Kept
