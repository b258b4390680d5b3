"""The torchft target (`target.system = "torchft"`, docs/targets/torchft.md): torchft 0.2.0's Lighthouse and one
replica group per learner (topology.chips_per_learner ranks each) running torchft_ddp or torchft_diloco on the
scenario's task. This module only registers the descriptor; torchft itself is imported by the run
(diloco_chaos/harness/targets/torchft/run.py) and its trainer processes, so the package imports without it.

Modules: rules (its validation rules, `Target.rules`), findings (the classified findings that explain a failed
invariant, `Target.findings`), lighthouse (start, readiness, teardown of
`torchft_lighthouse`), trainer (one rank's process), loops (the two algorithms' training loops), observe
(torchft's loggers and the global-weights digest as typed records), run (the run's supervisor: lighthouse,
groups, faults, watch, post-run phase).

Faults carried (docs/targets/torchft.md "Faults"): kill_chip, kill_learner and crash_host end a replica group,
which restarts as a whole after its repair delay and heals from a live peer; freeze SIGSTOPs a group's ranks
until SIGCONT; kill_syncer SIGKILLs the Lighthouse, restarted on its port after its repair delay. The link faults
the kernel link backend carries (LINK_KINDS) act on a whole replica group's traffic on netns hosts
(`[launch] hosts = "netns"`, `links.backend = "kernel"`: diloco_chaos/harness/config/target_check.py refuses them
otherwise). The other link faults and slow are refused (`refusal` says why)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from diloco_chaos.harness.targets.base import OnEvents, Target, register
from diloco_chaos.harness.targets.torchft.findings import FINDINGS
from diloco_chaos.harness.targets.torchft.rules import rules

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.run.supervisor import RunResult, Supervisor


def supervisor(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> Supervisor:
    from diloco_chaos.harness.targets.torchft.run import TorchftRun

    return TorchftRun(sc, run_root, on_events)


def run(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> RunResult:
    return supervisor(sc, run_root, on_events).run()


LINK_KINDS = frozenset({"partition", "degrade", "flap", "loss"})
"""The link faults it carries: those the kernel link backend carries (diloco_chaos/chaos/kernel_links.py), on
every TCP port of a replica group's veth (Gloo pairs, the checkpoint server, the Lighthouse and store links)."""
FAULT_KINDS = frozenset({"kill_chip", "kill_learner", "crash_host", "freeze", "kill_syncer"}) | LINK_KINDS
"""The `[[faults]]` actions the torchft target carries (LINK_KINDS on netns hosts only)."""
LINKS_NEED = ("one network namespace per replica group with links.backend = 'kernel' (launch.hosts = 'netns'): "
              "torchft's Gloo pairs and checkpoint server use ephemeral ports, so no proxy can carry them")
"""Why a link fault on torchft needs netns hosts and the kernel link backend (validation's reason)."""


REACTIONS = frozenset({"rejoin"})
"""The trigger reactions its runs show: a restarted group's first step (`learner_restart`, then its rank 0's
`step`) is "rejoin"; its restarted Lighthouse keeps no state to restore, so there is no "syncer_restored"."""


def reaction_refusal(reaction: str) -> str:
    """Why a torchft run never shows `reaction`."""
    if reaction == "syncer_restored":
        return ("a restarted Lighthouse has no checkpoint to restore (it is started empty on its port: "
                "`syncer_restart`, `lighthouse_ready`)")
    return "its runs write no record of it"


def refusal(kind: str) -> str:
    """Why the torchft target refuses fault kind `kind` (for a kind of LINK_KINDS: where it refuses it)."""
    from diloco_chaos.chaos import faults

    if kind in LINK_KINDS:  # carried, but only there (diloco_chaos/harness/config/target_check.py)
        return f"link faults need {LINKS_NEED}"
    if faults.get(kind).target == "link":
        return (f"link faults need {LINKS_NEED}, and the kernel link backend cannot carry {kind} (it carries "
                f"{', '.join(sorted(LINK_KINDS))})")
    return "not carried yet (untested against torchft's quorum and Gloo timeouts)"


TARGET = register(Target(
    name="torchft", summary="torchft 0.2.0: its Lighthouse and one replica group (Manager, ProcessGroupGloo) per "
                            "learner", run=run, fault_kinds=FAULT_KINDS, link_proxies=False, needs_module="torchft",
    fault_refusal=refusal, supervisor=supervisor, builtin_syncer=False, reactions=REACTIONS,
    reaction_refusal=reaction_refusal, rules=rules, findings=FINDINGS))
