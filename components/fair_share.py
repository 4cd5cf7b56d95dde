"""Fair share over time between HPC (slurmd pods) and AI (queued jobs): a small in-cluster
controller that moves the split of the two Kueue ClusterQueues' nominalQuota toward the side that
got less than its share of the contended GPU time. The hand-off twin runs this very code
(`FairShare.step`) on the readings it takes from its Prometheus with `queries`.

Why quotas: the next free GPU goes to whichever workload Kueue admits, and Kueue admits a queue's
head within its nominal quota before any borrower (kubernetes-sigs/kueue@v0.19.2:
pkg/scheduler/scheduler.go classicalIterator). A side whose nominal quota covers what it holds and
what it waits for therefore goes first for every GPU that frees; the other side's running work,
now above its lowered quota, keeps running (no queue preempts across the cohort,
components/kueue.py) and its GPUs come over as its jobs end. The KEDA rule follows the same
quota (`slurmd_scaling`'s `ai_quota` trigger reads Kueue's `kueue_cluster_queue_nominal_quota`),
so slurmd asks for the nodes of a wide Slurm job only when the quota says they are HPC's.

Usage, as Slurm's and Kueue's fair sharing count it, decays by half every `half_life_s`:
Slurm's priority/multifactor multiplies each association's usage_raw by decay_factor^dt with
decay_factor = 1 - 0.693 / PriorityDecayHalfLife and gives fs_factor = 2^(-usage/shares)
(SchedMD/slurm@slurm-25-11-6-1: src/plugins/priority/multifactor/priority_multifactor.c
_apply_decay, _set_assoc_fs_factor); Kueue's admission fair sharing keeps
consumed = old * (1 - a) + new * a with a = 1 - 0.5^(dt / usageHalfLifeTime)
(kubernetes-sigs/kueue@v0.19.2: pkg/util/admissionfairsharing/admission_fair_sharing.go
CalculateDecayedConsumed, calculateAlphaRate). The controller takes the decay and counts only
contended time: a second counts when both sides have work (running or waiting), as the contract
is stated over contended time (docs/handoff.md, "Fair share over time").

Rule, every `period_s`:
* A side is behind when its decayed share of the contended GPU time is below its guaranteed share
  less `margin`, and it has work waiting. The side behind gets a nominal quota of what it holds
  plus what waits (at least its guaranteed share, at most every GPU); the other gets the rest.
  Reservations for wide jobs alternate this way: the side that got the last one is ahead by it.
* The side behind keeps that quota (its turn) until it holds it or has nothing waiting, even once
  its share is back over the margin: a wide job needs every node of its claim at once, and the
  nodes come one by one as the other side's jobs end. Slinky's slurmd are dynamic nodes, so a
  Slurm job wider than the nodes registered is passed over (no backfill plan holds a node that is
  yet to join: SchedMD/slurm@slurm-25-11-6-1 src/slurmctld/node_scheduler.c _pick_best_nodes,
  seen on slurmctld 26.05.5 in tests/engines/test_slurm_states.py) and a narrower job behind it
  takes the nodes there are; the next node's arrival lets sched/backfill plan the wide job on them
  all, and the turn keeps those nodes until it starts, at the latest when the job on them reaches
  its limit. Without the turn the quota went back to the split as soon as the narrower job raised
  the side's share, the planned node was scaled in and the 4-node jobs never ran (issue 28).
* A reservation for HPC's wide job: neither side behind, HPC's job first in line (the runnable-jobs
  exporter names it in slurmctld's queue order: components/runnable_jobs.py queue_order) is wider
  than HPC's guaranteed share, and HPC has at most that share of the contended time: HPC gets a
  turn as if behind. AI's queue needs none: it is StrictFIFO (components/kueue.py), so a gang
  first in line holds back AI's narrower jobs and AI falls behind. Slurm's does, since a job wider
  than the registered nodes is passed over (above): HPC's own narrower jobs behind it kept HPC at
  its share, never behind, and the wide job waited for good (issue 28).
* On HPC's turn HPC's ClusterQueue lends nothing (`lending_limit`): each Kueue cycle admits every
  queue's head that fits, so AI's jobs borrowed the turn's GPUs one for one with slurmd's pods.
* Neither behind nor reserving: each side's guaranteed share (the program's split).
* An input lost (no reading from slurmctld's metrics or from Kueue's): the guaranteed split, the
  decayed usage kept as it was. Drain-first scale-in never kills, so moving back to the split only
  slows the side that was ahead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HPC, AI = "hpc", "ai"
SIDES = (HPC, AI)
PERIOD_S = 30  # one Kueue scrape: a reading changes no faster
HALF_LIFE_S = 1800  # usage half-life: a window of about 2 h holds 94 % of the weight
MARGIN = 0.02  # behind only when 2 points under its share: the contract's band is 5 points


# The contract the policy keeps (docs/handoff.md, "Fair share over time"), which `plan` states and
# the twin checks (twin/report.py, tests/twin/test_fair_share.py): while both sides have work, each
# side's share of the contended GPU time is within BAND of its guaranteed share over the run, when
# no job holds more than JOB_WINDOW_FRACTION of a window's GPU time; and over every WINDOW_S window
# in which both had work at least CONTENDED_ENOUGH of the time, within BAND plus the largest job's
# share of that window's GPU time (a job cannot be split).
WINDOW_S = 7200
BAND = 0.05
CONTENDED_ENOUGH = 0.5
JOB_WINDOW_FRACTION = 1 / 8


def contract_lines(hpc_gpus: int, ai_gpus: int, policy: str, controller: str) -> list[str]:
    """The contract in words, as `plan` prints it for the stack's split, under `policy` (the
    program's, fair-share), whose controller runs as `controller` (namespace/Deployment)."""
    total = hpc_gpus + ai_gpus
    job_gpu_s = WINDOW_S * total * JOB_WINDOW_FRACTION
    widest_min, one_gpu_min = round(job_gpu_s / total / 60), round(job_gpu_s / 60)
    return [
        f"fair share over time (policy {policy}: its controller runs as {controller}, the code the twin runs):",
        f"  while both sides have work, each gets its guaranteed share of the contended GPU time within "
        f"{round(BAND * 100)} points: HPC {hpc_gpus / total:.0%} ({hpc_gpus} of {total} GPUs), "
        f"AI {ai_gpus / total:.0%} ({ai_gpus} of {total})",
        f"  over the run, when no job holds more than 1/{round(1 / JOB_WINDOW_FRACTION)} of a window's GPU time: "
        f"a {total}-GPU job up to {widest_min} min, a 1-GPU job up to {one_gpu_min} min",
        f"  and over every {WINDOW_S // 3600} h window in which both had work at least {CONTENDED_ENOUGH:.0%} of "
        f"the time, within {round(BAND * 100)} points plus the largest job's share of the window's GPU time "
        f"(a job cannot be split: a {total}-GPU job of {widest_min} min adds {100 * JOB_WINDOW_FRACTION:g} points)",
    ]


def no_starvation_bounds(slurm_run_s: int, ai_run_s: int, handoff_s: int) -> dict[str, int]:
    """The waits the turn bounds, from the run limits the engines enforce (a Slurm job ends by its
    MaxTime plus a limit check and KillWait, an AI job by its max-exec-time) and the hand-off's
    latency (components/slurmd_scaling.py reclaim_bounds):
    * turn_start_s: a job first in line on the side behind, wide or not, starts within it of that
      side's turn: the other side's jobs on its GPUs end by their limits and the GPUs come over,
      then a narrower job of its own side that took the GPUs there were ends by its limit, the
      backfill plan holding them for it meanwhile (twin/slurm.py).
    * plan_hold_s: a Slurm node idles inside the plan of the job first in line at most until the
      jobs on the plan's other nodes reach their limits, all started before the hold began."""
    return {"turn_start_s": ai_run_s + slurm_run_s + handoff_s, "plan_hold_s": slurm_run_s}


def no_starvation_lines(bounds: dict[str, int], policy: str) -> list[str]:
    """The bounds in words, as `plan` prints them beside the contract."""
    return [
        f"no starvation (policy {policy}): a job first in line on the side behind its share, wide ones "
        f"included, starts within {bounds['turn_start_s']} s of that side's turn; a GPU held idle for a "
        f"Slurm backfill plan is held at most {bounds['plan_hold_s']} s",
        f"  a turn not served within {bounds['turn_start_s']} s ends, and its side gets no turn for as long again",
        "  a Slurm job first in line wider than HPC's share gets HPC's turn once HPC has at most its share "
        "(a reservation; none while the runnable-jobs exporter is lost)",
        "  not bounded: how long a side takes to fall behind (its decayed usage), and jobs behind the "
        "first in line of a side whose own work exceeds its share",
    ]


@dataclass(frozen=True)
class Reading:
    """What the controller sees each period; None where the input is lost."""

    used: dict[str, float | None]  # GPUs doing each side's work: Slurm's busy nodes, AI's admitted pods placed
    waiting: dict[str, float | None]  # Slurm's runnable pending jobs' nodes; AI's pending GPUs, pods unplaced
    hpc_first: float = 0.0  # the nodes of the runnable Slurm job first in line (0: none, or not known)


def reading(values: dict[str, float | None]) -> Reading:
    """A Reading from the values of `slurmd_scaling.fair_share_queries` (None: the query was empty).
    HPC waits for at least one node per runnable job and for its widest pending job's nodes."""
    widest = [v for k, v in values.items() if k.startswith("hpc_widest_")]
    runnable = values["hpc_runnable"]
    known = [v for v in widest if v is not None]
    hpc_waiting = None
    if runnable is not None and len(known) == len(widest):
        hpc_waiting = max(runnable, max(known, default=0.0) if runnable else 0.0)
    return Reading(
        used={HPC: values["hpc_used"], AI: values["ai_used"]},
        waiting={HPC: hpc_waiting, AI: values["ai_waiting"]},
        hpc_first=max((v or 0.0 for k, v in values.items() if k.startswith("hpc_first_")), default=0.0),
    )


def lending_limit(side: str, lends: bool, nominal: int, turn: str | None) -> int:
    """A queue's lendingLimit for a nominalQuota: all of it where the program lets the queue lend
    (`lends`), but none from HPC's queue on HPC's turn. AI's jobs are admitted by Kueue alone, and
    each Kueue cycle admits every queue's head that fits, borrowers after those within their quota
    (kubernetes-sigs/kueue@v0.19.2 pkg/scheduler/scheduler.go): without this, AI borrowed the GPUs
    of HPC's turn as they freed, one for each slurmd pod admitted, and the turn dragged on. AI's
    queue keeps lending on AI's turn: slurmd asks for pods only under AI's quota (the `ai_quota`
    trigger), and a queue that lends nothing admits up to its whole quota however many GPUs the
    other side's pods, over their lowered quota, still hold (Kueue counts quota, not GPUs), which
    would start a gang on the GPUs there are and idle them until the last one comes. A slurmd pod
    so admitted early is one pod waiting for one GPU. At most the quota, as Kueue's ClusterQueue
    webhook wants (pkg/webhooks/clusterqueue_webhook.go validateLendingLimit)."""
    return nominal if lends and not (side == HPC and turn == HPC) else 0


@dataclass(frozen=True)
class Quotas:
    """Each side's nominalQuota (GPUs), and why; the side on its turn (it lends nothing meanwhile)."""

    nominal: dict[str, int]
    reason: str
    turn: str | None = None


@dataclass
class FairShare:
    gpus_total: int
    guaranteed: dict[str, int]  # each side's share from the program's split
    # whether each side's queue lends (the program's aiBorrowsHpcGpus, hpcBorrowsAiGpus): a side may
    # hold more than its share only where the other lends, so its claim is at most its share
    # otherwise (a claim it can never hold would keep its turn, and the other side's quota at 0, for good)
    lends: dict[str, bool] = field(default_factory=lambda: {HPC: True, AI: True})
    # slurmd's maxReplicaCount (kedaMaxReplicas; None: every GPU): HPC holds no more, so its claim
    # is at most that (a claim of 3 with 2 pods allowed kept AI's quota at 1 while HPC had work)
    hpc_max: int | None = None
    half_life_s: float = HALF_LIFE_S
    margin: float = MARGIN
    usage: dict[str, float] = field(default_factory=lambda: {HPC: 0.0, AI: 0.0})
    last: float | None = None
    # A turn not served within `turn_limit_s` (the no-starvation bound, `no_starvation_bounds`:
    # what waits on it cannot start, say a constraint no node has) ends, and its side gets no turn
    # for as long again, so such a job costs the other side at most half the time; None: no limit.
    turn_limit_s: float | None = None
    resting_until: dict[str, float] = field(default_factory=dict)
    turn: tuple[str, int, float] | None = None  # the side whose claim holds until it holds it, the claim, since

    def split(self, reason: str = "the guaranteed split") -> Quotas:
        return Quotas(dict(self.guaranteed), reason)

    def guaranteed_share(self, side: str) -> float:
        return self.guaranteed[side] / self.gpus_total

    def shares(self) -> dict[str, float]:
        """Each side's decayed share of the contended GPU time; the guaranteed split before any."""
        total = sum(self.usage.values())
        if total <= 0:
            return {side: self.guaranteed_share(side) for side in SIDES}
        return {side: self.usage[side] / total for side in SIDES}

    def step(self, now: float, r: Reading) -> Quotas:
        lost = [
            f"{what} of {side}"
            for what, values in (("used", r.used), ("waiting", r.waiting))
            for side in SIDES
            if values[side] is None
        ]
        dt = 0.0 if self.last is None else now - self.last
        self.last = now
        if lost:
            self.turn = None
            return self.split("input lost: " + ", ".join(lost))
        used = {side: float(r.used[side] or 0) for side in SIDES}
        waiting = {side: float(r.waiting[side] or 0) for side in SIDES}
        decay = 0.5 ** (dt / self.half_life_s)
        contended = all(used[side] + waiting[side] > 0 for side in SIDES)
        for side in SIDES:
            self.usage[side] = self.usage[side] * decay + (used[side] * dt if contended else 0.0)
        shares = self.shares()
        if self.turn is not None:
            side, claim, since = self.turn
            self.turn = None
            if waiting[side] > 0 and used[side] < claim:
                if self.turn_limit_s is None or now - since <= self.turn_limit_s:
                    self.turn = (side, claim, since)
                    return self._claim(side, claim, f"{side}'s turn: holds {used[side]:g} of its {claim} GPUs")
                self.resting_until[side] = now + self.turn_limit_s
                return self.split(
                    f"{side}'s turn ended unserved after {now - since:.0f} s (holds {used[side]:g} of its {claim} "
                    f"GPUs): the guaranteed split, and no turn for {side} for {self.turn_limit_s:.0f} s",
                )
        resting = {side for side in SIDES if now < self.resting_until.get(side, now)}
        behind = [
            side
            for side in SIDES
            if side not in resting and waiting[side] > 0 and shares[side] < self.guaranteed_share(side) - self.margin
        ]
        if behind:
            side = behind[0]  # two sides cannot both be under their shares
            why = f"{side} behind: {100 * shares[side]:.0f} % of the contended GPU time against "
        elif (
            HPC not in resting
            and self.guaranteed[HPC] < r.hpc_first <= self.most(HPC)
            and shares[HPC] <= self.guaranteed_share(HPC)
        ):
            side = HPC
            why = f"hpc reserves for a {r.hpc_first:g}-node job first in line: {100 * shares[side]:.0f} % of the contended GPU time against "
        else:
            return self.split()
        claim = int(min(self.most(side), max(self.guaranteed[side], used[side] + waiting[side])))
        self.turn = (side, claim, now)
        return self._claim(side, claim, why + f"{100 * self.guaranteed[side] / self.gpus_total:.0f} %")

    def most(self, side: str) -> int:
        """The GPUs `side` may hold: every GPU where the other side's queue lends, else its share;
        HPC's at most slurmd's maxReplicaCount."""
        most = self.gpus_total if self.lends[AI if side == HPC else HPC] else self.guaranteed[side]
        return min(most, self.hpc_max) if side == HPC and self.hpc_max is not None else most

    def _claim(self, side: str, claim: int, reason: str) -> Quotas:
        other = AI if side == HPC else HPC
        return Quotas({side: claim, other: self.gpus_total - claim}, reason, turn=side)
