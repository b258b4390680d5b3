"""The scenario check's part for the system under test (`[target]`, `[torchft]`; docs/targets.md).

What: `target_rules` reports, each naming its key: a `target.system` the algorithm does not run on (a builtin
algorithm on torchft or a torchft algorithm on builtin); a missing module the target needs; a fault kind the
target cannot carry (naming target and kind, and the target's reason); a trigger on a reaction the target's
runs never show (`Target.reactions`: torchft's restarted Lighthouse restores no checkpoint, so no
"syncer_restored"); then the target's own rules (`Target.rules`: torchft's are
diloco_chaos/harness/targets/torchft/rules.py). Before those, for every scenario, torchft.ddp_api = 'ddp_module'
with an algorithm other than torchft_ddp (torchft rules.py `ddp_api_rule`): a builtin algorithm never reaches the
torchft rules and would ignore the key.

Why here: diloco_chaos/harness/config/check.py runs every cross-field rule; this module keeps the target's rules
together beside the task's (task_check.py), reading the target's descriptor (diloco_chaos/harness/targets/base.py)
rather than a list of names, so a plugin's target brings its rules with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.targets import base as targets
from diloco_chaos.harness.targets.torchft.rules import ddp_api_rule

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found


def target_rules(sc: Scenario, keys: list[str], found: Found) -> None:
    """Every error of the scenario's target settings (see the module doc); `keys[i]` names `sc.faults[i]`."""
    if not found.ok("algorithm", "target.system"):
        return
    ddp_api_rule(sc, found)
    alg = algorithms.get(sc.algorithm)
    system = targets.system_of(sc)
    if system != alg.system:
        found.add("target.system", f"target.system = {sc.target.system!r}: algorithm = {sc.algorithm!r} runs on "
                                   f"the {alg.system!r} system, not {system!r} (use 'auto' or {alg.system!r})")
        return
    target = targets.get(system)
    if not target.installed():
        found.add("target.system", f"target.system = {system!r}: needs the Python module {target.needs_module!r} "
                                   f"(pip install 'diloco-chaos[{target.needs_module}]')")
    if target.fault_kinds is not None:
        for key, f in zip(keys, sc.faults, strict=True):
            if f.action not in target.fault_kinds:
                allowed = ", ".join(sorted(target.fault_kinds)) or "none yet"
                why = f": {target.fault_refusal(f.action)}" if target.fault_refusal is not None else ""
                found.add(key, f"{key}.action = {f.action!r}: target {system!r} cannot carry this fault kind{why} "
                               f"(it carries: {allowed}; docs/targets.md)")
    if target.reactions is not None:
        for key, f in zip(keys, sc.faults, strict=True):
            for name, t in (("at", f.at), ("until", f.until)):
                if t is not None and t.after is not None and t.after not in target.reactions:
                    why = f": {target.reaction_refusal(t.after)}" if target.reaction_refusal is not None else ""
                    found.add(key, f"{key}.{name}.after = {t.after!r}: target {system!r} never shows this reaction"
                                   f"{why}, so the fault could never fire (it shows: "
                                   f"{', '.join(sorted(target.reactions)) or 'none'})")
    if target.rules is not None:
        target.rules(sc, keys, found)


def builtin_syncer(sc: Scenario) -> bool:
    """Whether a `kill_syncer` of `sc` hits the built-in syncer (its rules apply: diloco_chaos/harness/config/
    check.py); False when the scenario's target has its own coordinator (torchft: the Lighthouse). An unknown
    algorithm or system counts as built-in (their own errors are reported elsewhere)."""
    try:
        return targets.get(targets.system_of(sc)).builtin_syncer
    except ValueError:
        return True
