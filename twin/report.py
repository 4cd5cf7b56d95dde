"""The twin's result: each job's outcome, the latencies, the GPU returns, the contention and the
waits for a lent share, from the world and its ledger; and the report of a sweep over phase sets."""

from __future__ import annotations

import math
from typing import Any

from components import fair_share
from twin.ledger import Ledger
from twin.slurm import CANCELLED, COMPLETED, NEVER_SATISFIED, REFUSED, TIMEOUT, SlurmJob
from twin.world import World, gpu_uuid


def result(world: World, ledger: Ledger) -> dict:
    jobs = []
    for spec in world.scenario.jobs:
        if spec.kind == "slurm":
            tasks = world.slurm_jobs.get(spec.name, [])
            states = {t.state for t in tasks}
            outcome = "unfinished"
            if tasks and states == {COMPLETED}:
                outcome = "completed"
            if REFUSED in states:
                outcome = "refused"
            if tasks and states <= {COMPLETED, TIMEOUT} and TIMEOUT in states:
                outcome = "timed_out"  # its own time limit (--time or MaxTime), not the hand-off
            if tasks and all(t.reason == NEVER_SATISFIED for t in tasks):
                outcome = "cancelled"  # by slurmctld: what it depends on did not complete
            if any(t.restarts > t.failovers for t in tasks):  # requeued by the hand-off: its work was lost
                outcome = "killed"
            starts = [t.started for t in tasks if t.started is not None]
            ends = [t.finished for t in tasks if t.finished is not None]
            firsts = [t.first_in_line for t in tasks if t.first_in_line is not None]
            row: dict[str, Any] = {
                "started": min(starts) if starts else None,
                "finished": max(ends) if tasks and len(ends) == len(tasks) else None,
                "first_in_line": min(firsts) if firsts else None,
            }
            if outcome == "refused":
                row["reason"] = tasks[0].reason
            if any(t.failovers for t in tasks):  # requeued when its node failed (a fault, not the hand-off)
                row["requeued_by_node_failure"] = sum(t.failovers for t in tasks)
            if outcome == "cancelled":
                row["reason"] = f"{spec.after} did not complete: {NEVER_SATISFIED}, cancelled (kill_invalid_depend)"
            if outcome == "timed_out":
                limit = next(t.time_limit for t in tasks if t.state == TIMEOUT and t.time_limit is not None)
                row["reason"] = f"slurmctld ended it at its time limit, {limit / 60:g} min (TIMEOUT)"
        else:
            kj = world.kube_jobs.get(spec.name)
            outcome = "unfinished" if not kj or kj.finished is None else "failed" if kj.failed else "completed"
            row = {"started": kj.started if kj else None, "finished": kj.finished if kj else None}
            if spec.name in world.denied:
                outcome, row["reason"] = "refused", world.denied[spec.name]
            if world.kueue is not None and kj is not None:
                w = next(w for w in world.kueue.workloads if w.job is kj)
                row |= {"admitted": w.first_admitted, "evictions": w.evictions}
                if w.deactivated_at is not None:  # stopped at its own limit, not by the hand-off
                    outcome = "timed_out"
                    row["reason"] = f"Kueue stopped it after {w.limit:g} s admitted (its run limit)"
        jobs.append({"name": spec.name, "kind": spec.kind, "outcome": outcome, "submitted": spec.submit, **row})
    slurm_done = [j.finished for j in world.slurm.jobs if j.state in (COMPLETED, TIMEOUT) and j.finished is not None]
    gpu_return = None
    if slurm_done:
        last = max(slurm_done)
        back = next((max(start, last) for start, end in ledger.zero_spans if end >= last), None)
        if back is not None:
            gpu_return = max(0.0, back - last)
    waits = [j.started - _eligible_since(world, j) for j in world.slurm.jobs if j.started is not None]
    return {
        "jobs": jobs,
        "killed": sorted(set(world.killed)),
        "double_held": sorted(gpu_uuid(g) for g in world.kube.double_held),
        "unfinished": [j["name"] for j in jobs if j["outcome"] == "unfinished"],
        "timed_out": [j["name"] for j in jobs if j["outcome"] == "timed_out"],  # Slurm's and Kueue's
        "end": {
            "slurmd_replicas": world.nodeset.replicas,
            "gpus_held_by_slurmd": ledger.held_now,
        },
        "latency": {"scale_up_s": max(waits) if waits else None, "gpu_return_s": gpu_return},
        "returns": _returns(world, ledger),
        "slurmd_starts": world.nodeset.starts,
        "gpu_owner_changes": ledger.owner_changes,
        "slurmd_idle_gpu_s": ledger.idle_gpu_s,
        "trigger_errors": world.keda.errors,
        "kueue": world.kueue is not None,
        "slurmd_in_kueue": world.slurmd_queued,
        "kueue_pod_evictions": world.kueue.pod_evictions if world.kueue is not None else 0,
        "contention": _contention(ledger),
        # seconds each side waited for its lent share, per wait; one still open at the end counts
        # until then
        "reclaim_waits": {
            side: waits + ([world.now - since] if (since := ledger.lent_since[side]) is not None else [])
            for side, waits in ledger.reclaim_waits.items()
        },
        "sides": _sides(world, ledger),
        # Fault node-failure: when the node failed and came back, the Slurm jobs requeued, the pods evicted
        "failure_events": [[t, what, name] for t, what, name in world.failure_events],
        # The longest a Slurm node idled inside a pending job's backfill plan (twin/slurm.py)
        "slurm_plan_hold_max_s": ledger.longest_plan_hold(world.now),
    }


# The fair-share report's sliding window, and a window counts when both sides had work for at least
# CONTENDED_ENOUGH of it: the contract's (components/fair_share.py, docs/handoff.md)
FAIR_WINDOW_S, CONTENDED_ENOUGH = fair_share.WINDOW_S, fair_share.CONTENDED_ENOUGH


def _sides(world: World, ledger: Ledger) -> dict:
    """Per side: its share of the contended GPU time overall and over each sliding window, its
    waits by width (Slurm: nodes, from submit, --begin, release or dependency to start; AI: GPUs,
    from submit to start; each job's first wait, never restarted), the jobs that fit the cluster
    and never started, and the GPU-seconds idle while its fitting work waited (of them, held for it)."""
    waits: dict[str, dict[int, list[float]]] = {"slurm": {}, "kubernetes": {}}
    never: dict[str, list[str]] = {"slurm": [], "kubernetes": []}
    gpus = world.kube.gpus
    for j in world.slurm.jobs:
        if j.state in (REFUSED, CANCELLED) or j.nodes_needed > gpus:
            continue
        if j.started is not None:
            waits["slurm"].setdefault(j.nodes_needed, []).append(j.started - _eligible_since(world, j))
        else:
            never["slurm"].append(j.spec.name)
    for spec in world.scenario.jobs:
        kj = world.kube_jobs.get(spec.name)
        if spec.kind == "slurm" or spec.name in world.denied or spec.gpus_wanted > gpus:
            continue
        if kj is not None and kj.started is not None:
            waits["kubernetes"].setdefault(spec.gpus_wanted, []).append(kj.started - spec.submit)
        else:
            never["kubernetes"].append(spec.name)
    windows = _window_shares(ledger.contended_minutes)
    share = _contention(ledger)["share"]
    return {
        side: {
            "share": share[side],
            "window_share": {"window_s": FAIR_WINDOW_S, **windows[side]},
            "waits_by_width": {
                str(width): {"jobs": len(w), "p50": percentile(w, 50), "p95": percentile(w, 95), "max": max(w)}
                for width, w in sorted(waits[side].items())
            },
            "never_started": sorted(set(never[side])),
            "idle_while_waiting_gpu_s": ledger.idle_while_waiting[side],
            "held_for_reservation_gpu_s": ledger.held_for_reservation[side],
        }
        for side in ("slurm", "kubernetes")
    }


def _window_shares(minutes: list[list[float]]) -> dict[str, dict]:
    """Each side's lowest and highest share of the GPU time used over the sliding windows of
    FAIR_WINDOW_S (a minute apart) in which both sides had work for CONTENDED_ENOUGH of it."""
    span = FAIR_WINDOW_S // 60
    shares: list[float] = []
    for start in range(max(0, len(minutes) - span) + 1):
        window = minutes[start : start + span]
        slurm, ai, seconds = (sum(m[i] for m in window) for i in range(3))
        if seconds >= CONTENDED_ENOUGH * FAIR_WINDOW_S and slurm + ai:
            shares.append(slurm / (slurm + ai))
    if not shares:
        return {
            "slurm": {"windows": 0, "min": None, "max": None},
            "kubernetes": {"windows": 0, "min": None, "max": None},
        }
    low, high = min(shares), max(shares)
    return {
        "slurm": {"windows": len(shares), "min": round(low, 3), "max": round(high, 3)},
        "kubernetes": {"windows": len(shares), "min": round(1 - high, 3), "max": round(1 - low, 3)},
    }


def _returns(world: World, ledger: Ledger) -> list[dict]:
    """For each Slurm job that ended while a Kubernetes job waited: `last` (no other Slurm job
    ran) or `partial` (others kept running), the seconds until slurmd held one GPU fewer
    (`gpu_freed_s`) and until a waiting Kubernetes job ran (`kube_running_s`). Ends after
    which Slurm still had work pending (not held), or started another job before a GPU was freed,
    are left out: the rule keeps GPUs for that work."""
    out = []
    for job, waiting in ledger.waiting_at_end:
        end = job.finished
        assert end is not None  # noted when it ended
        if any(_pending_at(o, end) for o in world.slurm.jobs if o is not job):
            continue
        others = [(o.started, o.finished) for o in world.slurm.jobs if o is not job and o.started is not None]
        running = any(started <= end and (finished is None or finished > end) for started, finished in others)
        before = ledger.held[int(end) - 1] if end >= 1 else 0
        freed = next((t - end for t in range(int(end), len(ledger.held)) if ledger.held[t] < before), None)
        if any(end <= started <= end + (freed if freed is not None else float("inf")) for started, _ in others):
            continue
        starts = [j.started for j in waiting if j.started is not None and j.started >= end]
        out.append(
            {
                "slurm_job": job.spec.name,
                "ended": end,
                "kind": "partial" if running else "last",
                "gpu_freed_s": freed,
                "kube_running_s": min(starts) - end if starts else None,
            }
        )
    return out


def _pending_at(j: SlurmJob, t: float) -> bool:
    if j.state == REFUSED or j.spec.submit > t or (j.started is not None and j.started <= t):
        return False
    return not (j.spec.hold and (j.spec.release is None or j.spec.release > t))


def _contention(ledger: Ledger) -> dict:
    """Each side's share of the GPU time used while both had work waiting or running: a slurmd
    pod counts while its Slurm node runs a job, a Kubernetes job's pods while the job runs
    (a gang holding GPUs while it waits for its last pod counts for neither)."""
    c = ledger.contended
    used = c["slurm"] + c["kubernetes"]
    share = {side: round(c[side] / used, 3) if used else None for side in ("slurm", "kubernetes")}
    return {"seconds": c["seconds"], "gpu_s": {s: c[s] for s in ("slurm", "kubernetes")}, "share": share}


def _eligible_since(world: World, j: SlurmJob) -> float:
    since = j.spec.submit
    if j.spec.begin is not None:
        since = max(since, j.spec.begin)
    if j.spec.release is not None:
        since = max(since, j.spec.release)
    if j.spec.after is not None:
        parents = world.slurm_jobs.get(j.spec.after, [])
        ends = [p.finished for p in parents if p.finished is not None]
        if parents and len(ends) == len(parents):
            since = max(since, *ends)
    if j.spec.throttle is not None:
        # a throttled task is eligible once an earlier task of its array has ended
        array_ends = sorted(t.finished for t in world.slurm_jobs[j.spec.name] if t.finished is not None)
        earlier = [e for e in array_ends if e <= (j.started or 0)]
        if earlier:
            since = max(since, earlier[-1])
    return since


def ok(result: dict) -> bool:
    """Exit 0: nothing killed or double-held, and every job that was not refused completed."""
    return (
        not result["killed"]
        and not result["double_held"]
        and all(j["outcome"] in ("completed", "refused") for j in result["jobs"])
    )


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _spread(values: list[float | None]) -> dict | None:
    """p50, p95 and max of the values known, and how many runs had none (never happened)."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    return {
        "p50": percentile(known, 50),
        "p95": percentile(known, 95),
        "max": max(known),
        "none": len(values) - len(known),
    }


def summary(results: dict[int, dict]) -> dict:
    """`sweep`'s report from the results of its runs, by phase set."""
    returns = [r for result in results.values() for r in result["returns"]]
    return {
        "phase_sets": list(results),
        "latency": {
            name: _spread([r["latency"][name] for r in results.values()]) for name in ("scale_up_s", "gpu_return_s")
        },
        "returns": {
            kind: {
                name: _spread([r[name] for r in returns if r["kind"] == kind])
                for name in ("gpu_freed_s", "kube_running_s")
            }
            for kind in ("last", "partial")
        },
        "reclaim_waits": {
            side: _spread([w for r in results.values() for w in r["reclaim_waits"][side]])
            for side in ("slurm", "kubernetes")
        },
        "sides": {side: _sides_over(results, side) for side in ("slurm", "kubernetes")},
        "killed": {n: r["killed"] for n, r in results.items() if r["killed"]},
        "double_held": {n: r["double_held"] for n, r in results.items() if r["double_held"]},
        "not_ok": [n for n, r in results.items() if not ok(r)],
    }


def _sides_over(results: dict[int, dict], side: str) -> dict:
    """A side over every phase set: its contended share (p50/p95/max over the sets), its lowest
    share over any window of any set, the longest wait by width, and the sets in which a job of
    it never started."""
    sides = [r["sides"][side] for r in results.values()]
    lows = [s["window_share"]["min"] for s in sides if s["window_share"]["min"] is not None]
    widths = sorted({w for s in sides for w in s["waits_by_width"]}, key=int)
    return {
        "share": _spread([s["share"] for s in sides]),
        "lowest_window_share": min(lows) if lows else None,
        "longest_wait_by_width": {
            w: max(s["waits_by_width"][w]["max"] for s in sides if w in s["waits_by_width"]) for w in widths
        },
        "never_started": {
            n: r["sides"][side]["never_started"] for n, r in results.items() if r["sides"][side]["never_started"]
        },
    }
