"""Goodput and uptime from a run's event log (definitions and formulas in docs/metrics.md).

goodput: chip-seconds spent on inner steps whose work reached the global model, over the chip-seconds
allocated to the run (M x C x the training span). A step's chip-seconds are its chips x its interval (from
the learner's previous step, or from when it was ready after a (re)start) minus `sync_s`, the time the host
spent in its link to the syncer during it: a synchronous baseline's barrier wait, Decoupled DiLoCo's taking
and publishing fragments. A step longer than STALL_FACTOR x the learner's median is a stall (a frozen
process, a hung collective): only that bound of it counts. A step is good if a merge took in a push of its
learner covering it (decoupled: any fragment's merged step range; diloco: the round that contains it; ddp: the
step's own merge). Steps lost in a crash, superseded or never merged count zero; time a learner spent down or
idle after finishing counts as allocated and not good. This is the paper's notion (time lost to failures,
restarts and waiting); `merged_fraction` keeps the stricter per-fragment figure for Decoupled DiLoCo, where a
fragment's own overlap steps are overwritten when the merged value arrives.

uptime: the fraction of the training span in which the global model advanced within `window_s`, i.e. 1 - the
downtime, where downtime intervals are the gaps between consecutive merges (and the span's ends) longer than
`window_s`, each counted beyond its first `window_s`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

DOWNTIME_WINDOW_S = 1.0
"""A gap between merges longer than this is downtime (beyond this allowance)."""


STALL_FACTOR = 5.0
"""A step counts for at most this many times its learner's median step time; beyond that it is a stall."""


def _steps(evs: list[dict[str, Any]]) -> tuple[dict[int, list[tuple[int, float, int]]], float]:
    """learner -> [(step, seconds spent on it, chips)] for every logged inner step: its interval (from the
    previous step's end, or the learner's ready time) minus its time in the link (`sync_s`); logs written
    before `sync_s` existed give `compute_s` instead. Stalls are cut to STALL_FACTOR x the median.
    Also returns the training span: from the first step's beginning to the last step's end."""
    out: dict[int, list[tuple[int, float, int]]] = defaultdict(list)
    first, end = float("inf"), float("-inf")
    starts = {e["learner"]: e["t"] for e in evs if e["ev"] == "learner_restart"}
    last: dict[int, float] = {}
    for e in sorted((e for e in evs if e["ev"] in ("step", "chip_start", "initial_pull", "resume")
                     and "learner" in e), key=lambda e: e["t"]):
        m = e["learner"]
        if e["ev"] != "step":
            if e.get("rank", 0) == 0:
                last[m] = e["t"]  # a (re)started learner's first step starts when it was ready
            continue
        begin = last.get(m, starts.get(m, e["t"]))
        first, end = min(first, begin), max(end, e["t"])
        spent = e["t"] - begin
        if "sync_s" in e:
            spent -= float(e["sync_s"])
        elif "compute_s" in e:
            spent = min(spent, float(e["compute_s"]))
        out[m].append((int(e["step"]), max(0.0, spent), int(e.get("chips", 1))))
        last[m] = e["t"]
    for m, xs in out.items():
        cap = STALL_FACTOR * sorted(d for _, d, _ in xs)[len(xs) // 2]
        out[m] = [(s, min(d, cap), c) for s, d, c in xs]
    return out, (end - first if out else 0.0)


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
        elif algorithm in ("ddp", "elastic_ddp"):
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
    steps, span = _steps(evs)
    if not steps or span <= 0:
        return {"goodput": None, "merged_fraction": None, "good_chip_s": 0.0, "allocated_chip_s": 0.0,
                "per_learner": {}}
    allocated = learners * chips * span
    cover = _covered(evs, algorithm, fragments, sync_every)
    good_total = strict_total = 0.0
    per = {}
    for m, xs in steps.items():
        good = sum(d * c for s, d, c in xs if cover[m].get(s, 0.0) > 0)
        strict = sum(min(1.0, cover[m].get(s, 0.0)) * d * c for s, d, c in xs)
        spent = sum(d * c for _, d, c in xs)
        per[str(m)] = {"good_chip_s": round(good, 3), "step_chip_s": round(spent, 3)}
        good_total += good
        strict_total += strict
    return {"goodput": round(good_total / allocated, 4), "merged_fraction": round(strict_total / allocated, 4),
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


def _summary(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "max": None}
    s = sorted(xs)
    return {"n": len(s), "mean": round(sum(s) / len(s), 4), "p50": round(s[len(s) // 2], 4), "max": round(s[-1], 4)}


def merge_stats(evs: list[dict[str, Any]], fragments: int) -> dict[str, Any]:
    """Per merge: quorum size (participants), time waited for the quorum and in the grace window, and the
    staleness of each merged push (the fragment's version before this merge - the version the push was
    based on: 0 = the learner had the latest); tokens merged per learner (its c_tokens / P per merge)."""
    merges = [e for e in evs if e["ev"] == "merge" and "participants" in e]
    staleness: list[float] = []
    tokens: dict[str, float] = defaultdict(float)
    for e in merges:
        for i, m in enumerate(e["participants"]):
            if "base_versions" in e:
                staleness.append(float(e["version"] - 1 - e["base_versions"][i]))
            if "c_tokens" in e and i < len(e["c_tokens"]):
                tokens[str(m)] += e["c_tokens"][i] / (fragments if "base_versions" in e else 1)
    return {"quorum_size": _summary([float(len(e["participants"])) for e in merges]),
            "quorum_wait_s": _summary([e["quorum_wait_s"] for e in merges if "quorum_wait_s" in e]),
            "grace_wait_s": _summary([max(0.0, e["wait_s"] - e["quorum_wait_s"]) for e in merges
                                      if "wait_s" in e and "quorum_wait_s" in e]),
            "staleness_versions": _summary(staleness),
            "tokens_merged_per_learner": {m: round(v, 1) for m, v in sorted(tokens.items())}}


def learner_availability(evs: list[dict[str, Any]], learners: int, start: float, end: float) -> dict[str, Any]:
    """Per learner: the fraction of [start, end] (the training span) it was alive as the syncer saw it, i.e.
    between its `learner_join` and the next `learner_leave` (or the syncer going down)."""
    alive_since: dict[int, float] = {}
    up: dict[int, float] = defaultdict(float)
    for e in sorted(evs, key=lambda e: e["t"]):
        t = min(max(e["t"], start), end)
        if e["ev"] == "learner_join":
            alive_since.setdefault(e["learner"], t)
        elif e["ev"] in ("learner_leave", "learner_bye") and e["learner"] in alive_since:
            up[e["learner"]] += t - alive_since.pop(e["learner"])
        elif e["ev"] in ("syncer_down", "syncer_start"):
            for m, t0 in alive_since.items():
                up[m] += t - t0
            alive_since.clear()
    for m, t0 in alive_since.items():
        up[m] += end - t0
    span = end - start
    return {str(m): round(up[m] / span, 4) if span > 0 else None for m in range(learners)}


_REACTIONS = ("learner_down", "learner_shrink", "learner_leave", "syncer_down")
_BACK = {"learner_down": "learner_restart", "learner_shrink": "chip_joined", "syncer_down": "syncer_restore"}


def fault_response(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fault that hit a process or link: time to detect (fault start -> the first reaction to it: the
    supervisor's learner_down / learner_shrink / syncer_down, or the syncer dropping the learner), and time to
    rejoin (that reaction -> the learner stepping again, the repaired chip joined, or the syncer restored)."""
    out = []
    ordered = sorted(evs, key=lambda e: e["t"])
    for f in (e for e in ordered if e["ev"] == "fault_start"):
        who = f.get("learner")
        react = next((e for e in ordered if e["t"] >= f["t"] and e["ev"] in _REACTIONS
                      and (e.get("learner") == who or e["ev"] == "syncer_down")), None)
        row: dict[str, Any] = {"index": f["index"], "action": f["action"], "learner": who,
                               "detect_s": round(react["t"] - f["t"], 3) if react else None,
                               "reaction": react["ev"] if react else None, "rejoin_s": None}
        if react is not None:
            back_ev = _BACK.get(react["ev"])
            back = next((e for e in ordered if e["t"] > react["t"] and (
                (back_ev is not None and e["ev"] == back_ev and e.get("learner", who) == who)
                or (react["ev"] == "learner_leave" and e["ev"] == "learner_join" and e["learner"] == who))), None)
            if back is not None and react["ev"] == "learner_down":  # back = stepping again after the restart
                back = next((e for e in ordered if e["t"] > back["t"] and e["ev"] == "step"
                             and e["learner"] == who), None)
            row["rejoin_s"] = round(back["t"] - react["t"], 3) if back else None
        out.append(row)
    return out
