"""The learner's side of all three algorithms, independent of processes and sockets.

A learner is C chips training data-parallel on one shard. `LearnerCore` holds
one chip's replica, its AdamW inner optimizer and Decoupled DiLoCo's
per-fragment bookkeeping (counters c_steps / c_tokens since the fragment was
last received, versions, outstanding pushes, merged fragments waiting for
their apply step). The three loops (`run_decoupled`, `run_diloco`, `run_ddp`)
drive it; the harness injects the two things that are not pure logic:

* a `Collective` for the chips of this learner (a Gloo group in a real run),
* on the learner's host (rank 0) only, a link to the syncer.

Every chip makes the same decisions because rank 0 decides and broadcasts
them inside the learner (which fragments to apply at this step, and their
values), so the replicas of one learner never diverge.

The code lives in three modules: diloco_chaos/trainers/messages.py (the typed messages shared with the syncer),
diloco_chaos/trainers/learner_core.py (`LearnerCore`, the collective, the inner optimizer) and
diloco_chaos/trainers/learner_loops.py
(the loops); this module re-exports their public names, which suites, benches and tests import from here.
"""

from diloco_chaos.trainers.learner_core import (
    Collective,
    CollectiveFailed,
    DecoupledLink,
    FragmentState,
    InnerOptimizer,
    LearnerCore,
    SoloCollective,
    SyncLink,
    inner_lr,
    params_finite,
)
from diloco_chaos.trainers.learner_loops import (
    ApplyHook,
    BatchFn,
    RegroupHook,
    StepHook,
    host_state,
    initial_pull,
    regroup,
    regroup_after,
    resume_sync,
    run_ddp,
    run_decoupled,
    run_diloco,
    sync_replicas,
)
from diloco_chaos.trainers.messages import (
    STATE_STEP_KEY,
    FragmentPush,
    MergedFragment,
    Snapshot,
    flatten,
    unflatten_into,
)

__all__ = [
    "STATE_STEP_KEY", "ApplyHook", "BatchFn", "Collective", "CollectiveFailed", "DecoupledLink", "FragmentPush",
    "FragmentState", "InnerOptimizer", "LearnerCore", "MergedFragment", "RegroupHook", "Snapshot",
    "SoloCollective", "StepHook", "SyncLink", "flatten", "host_state", "initial_pull", "inner_lr",
    "params_finite", "regroup", "regroup_after", "resume_sync", "run_ddp", "run_decoupled", "run_diloco",
    "sync_replicas", "unflatten_into",
]
