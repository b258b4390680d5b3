"""Goodput and uptime from a run's event log (definitions and formulas in docs/metrics.md).

goodput: chip-seconds spent on inner steps whose contribution reached the global model, over the chip-seconds
allocated to the run (M x C x the training span). A step of learner m counts for the fraction of fragments
whose merges took in a push of m covering that step (decoupled: per fragment, the merge's step_ranges;
diloco: the round that contains the step; ddp: the step's own merge). Steps lost in a crash, superseded or
never merged count zero; time a learner spent down counts as allocated and not good.

uptime: the fraction of the training span in which the global model advanced within `window_s`, i.e. 1 - the
downtime, where downtime intervals are the gaps between consecutive merges (and the span's ends) longer than
`window_s`, each counted beyond its first `window_s`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

DOWNTIME_WINDOW_S = 1.0
"""A gap between merges longer than this is downtime (beyond this allowance)."""


def _steps(evs: list[dict[str, Any]]) -> dict[int, list[tuple[int, float, float, int]]]:
    """learner -> [(step, start_t, end_t, chips)] for every logged inner step (start = previous step's end)."""
    out: dict[int, list[tuple[int, float, float, int]]] = defaultdict(list)
    starts = {e["learner"]: e["t"] for e in evs if e["ev"] == "learner_restart"}
    last: dict[int, float] = {}
    for e in sorted((e for e in evs if e["ev"] in ("step", "chip_start", "initial_pull", "resume")
                     and "learner" in e), key=lambda e: e["t"]):
        m = e["learner"]
        if e["ev"] != "step":
            if e.get("rank", 0) == 0:
                last[m] = e["t"]  # a (re)started learner's first step starts when it was ready
            continue
        t0 = last.get(m, starts.get(m, e["t"]))
        out[m].append((int(e["step"]), t0, e["t"], int(e.get("chips", 1))))
        last[m] = e["t"]
    return out


def _covered(evs: list[dict[str, Any]], algorithm: str, fragments: int, sync_every: int) -> dict[int, dict[int, float]]:
    """learner -> step -> fraction of the model (fragments) into which that step's work was merged."""
    cover: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for e in evs:
        if e["ev"] != "merge" or "participants" not in e:
            continue
        if algorithm == "decoupled":
            for m, (a, b) in zip(e["participants"], e.get("step_ranges", []), strict=False):
                for s in range(int(a), int(b) + 1):
                    cover[m][s] += 1.0 / fragments
        elif algorithm == "ddp":
            for m in e["participants"]:
                cover[m][int(e["step"])] = 1.0
        else:
            r = int(e["round"])
            for m in e["participants"]:
                for s in range((r - 1) * sync_every + 1, min(r * sync_every, int(e["step"])) + 1):
                    cover[m][s] = 1.0
    return cover


def goodput(evs: list[dict[str, Any]], algorithm: str, learners: int, chips: int, fragments: int,
            sync_every: int) -> dict[str, Any]:
    steps = _steps(evs)
    all_t = [t for xs in steps.values() for _, a, b, _ in xs for t in (a, b)]
    if not all_t:
        return {"goodput": None, "good_chip_s": 0.0, "allocated_chip_s": 0.0, "per_learner": {}}
    span = max(all_t) - min(all_t)
    allocated = learners * chips * span
    cover = _covered(evs, algorithm, fragments, sync_every)
    good_total, per = 0.0, {}
    for m, xs in steps.items():
        good = sum(min(1.0, cover[m].get(s, 0.0)) * (b - a) * c for s, a, b, c in xs)
        spent = sum((b - a) * c for _, a, b, c in xs)
        per[str(m)] = {"good_chip_s": round(good, 3), "step_chip_s": round(spent, 3)}
        good_total += good
    return {"goodput": round(good_total / allocated, 4) if allocated > 0 else None,
            "good_chip_s": round(good_total, 3), "allocated_chip_s": round(allocated, 3), "per_learner": per}


def downtime(merge_times: list[float], start: float, end: float,
             window_s: float = DOWNTIME_WINDOW_S) -> dict[str, Any]:
    points = [start, *sorted(t for t in merge_times if start <= t <= end), end]
    intervals = [(a + window_s, b) for a, b in zip(points, points[1:], strict=False) if b - a > window_s]
    down = sum(b - a for a, b in intervals)
    span = end - start
    return {"uptime": round(1 - down / span, 4) if span > 0 else None, "downtime_s": round(down, 3),
            "window_s": window_s, "intervals": [[round(a - start, 3), round(b - start, 3)] for a, b in intervals]}


def achieved_speeds(evs: list[dict[str, Any]], learners: int) -> list[dict[str, Any]]:
    """For every `slow` fault: the learner's steps over the mean steps of the learners that were not slowed,
    in the window where all of them were training (from the fault's start to its end, or to the first of them
    finishing). That ratio is what a speed profile means: an older chip does `speed` x the steps of a new one."""
    ons = [e for e in evs if e["ev"] == "process_fault" and e.get("kind") == "slow"]
    offs = {e["learner"]: e["t"] for e in evs if e["ev"] == "process_fault_off" and e.get("kind") == "slow"}
    slowed = {e["learner"] for e in ons}
    steps: dict[int, list[tuple[float, int]]] = defaultdict(list)
    done: dict[int, float] = {}
    for e in evs:
        if e["ev"] == "step":
            steps[e["learner"]].append((e["t"], int(e["step"])))
        elif e["ev"] == "learner_done":
            done[e["learner"]] = e["t"]
    refs = [m for m in range(learners) if m not in slowed and steps.get(m)]
    out = []
    for on in ons:
        m = on["learner"]
        t0 = on["t"]
        t1 = min([offs.get(m, float("inf")), *(done.get(r, float("inf")) for r in [m, *refs])])
        if not refs or t1 == float("inf") or t1 <= t0:
            out.append({"learner": m, "speed": on["speed"], "achieved": None, "window_s": 0.0})
            continue

        def progress(r: int, a: float = t0, b: float = t1) -> int:
            inside = [s for t, s in steps[r] if a <= t <= b]
            return max(inside) - min(inside) if len(inside) > 1 else 0

        ref = sum(progress(r) for r in refs) / len(refs)
        out.append({"learner": m, "speed": on["speed"], "achieved": round(progress(m) / ref, 4) if ref else None,
                    "window_s": round(t1 - t0, 3), "steps": progress(m), "reference_steps": round(ref, 1)})
    return out
