"""What the twin counts while it runs, second by second: the GPUs slurmd holds and uses, each
side's GPU time while both have work (contention), the Slurm jobs that end while Kubernetes work
waits, and each side's waits for its lent share. twin/report.py turns it into the result."""

from __future__ import annotations

from core.names import AI_CLUSTER_QUEUE, HPC_CLUSTER_QUEUE
from twin import kube as k8s
from twin.slurm import PENDING, SlurmJob
from twin.world import World


class Ledger:
    def __init__(self, world: World) -> None:
        self.world = world
        self.idle_gpu_s = 0.0  # GPU-seconds held by slurmd pods whose Slurm node runs no job
        self.held_now = 0
        # GPU-seconds each side holds while both have work waiting or running (contention)
        self.contended = {"slurm": 0.0, "kubernetes": 0.0, "seconds": 0.0}
        self.zero_spans: list[list[float]] = []  # [start, end] of times slurmd held no GPU
        self.held: list[int] = []  # GPUs slurmd held, per second
        self.gpu_holder: dict[int, str] = {}
        self.owner_changes = 0  # a GPU going from slurmd to a Kubernetes job or back
        self.waiting_at_end: list[tuple[SlurmJob, list[k8s.KubeJob]]] = []  # Slurm job ends while AI waits
        # Each side's guaranteed GPUs (its ClusterQueue's nominalQuota), and the stretches it waited
        # below them while the other side held more than its own: a lent share not yet back.
        self.shares = (
            {
                side: world.kueue.queues[cq].nominal
                for side, cq in (("slurm", HPC_CLUSTER_QUEUE), ("kubernetes", AI_CLUSTER_QUEUE))
            }
            if world.kueue is not None
            else None
        )
        self.reclaim_waits: dict[str, list[float]] = {"slurm": [], "kubernetes": []}
        self.lent_since: dict[str, float | None] = {"slurm": None, "kubernetes": None}
        self._noted: set[int] = set()  # the Slurm jobs in waiting_at_end
        # Per minute of contention: each side's GPU-seconds used and the seconds contended, for the
        # shares over a sliding window (twin/report.py).
        self.contended_minutes: list[list[float]] = []
        # GPU-seconds not running a job (free, or a slurmd pod whose node runs nothing) while work of
        # the side that fits the cluster waits; and of those, the ones kept for that side's waiting
        # work: idle slurmd nodes while a Slurm job waits, free GPUs while an AI job waits.
        self.idle_while_waiting = {"slurm": 0.0, "kubernetes": 0.0}
        self.held_for_reservation = {"slurm": 0.0, "kubernetes": 0.0}
        # Each stretch a registered Slurm node stayed idle inside a pending job's backfill plan
        # (twin/slurm.py Plan): since when, by node, and the longest (a bound holds it: fair_share).
        self.plan_hold_since: dict[str, float] = {}
        self.plan_hold_max_s = 0.0
        self._slurm_waiting: tuple[bool, bool] | None = None  # _slurm_waits' answer this second

    def note_ends(self, now: float) -> None:
        """Each Slurm job that ends while a Kubernetes job waits (queued in Kueue or Pending)."""
        if not self.world.slurm.completed_now:
            return
        waiting = [j for j in self.world.kube.open_jobs if j.started is None and j.finished is None]
        if waiting:
            ended = [j for j in self.world.slurm.completed_now if id(j) not in self._noted]
            self._noted.update(id(j) for j in ended)
            self.waiting_at_end += [(j, waiting) for j in ended]

    def account(self, now: float) -> None:
        """One second's GPUs: who holds them, who uses them, and each side's wait for its lent share."""
        busy = self.world.slurm.busy_nodes()
        self._slurm_waiting = None  # this second's, once asked
        held = idle = used = 0  # GPUs slurmd pods hold; of them, on nodes running nothing / a job
        ai_held = 0  # GPUs Kubernetes jobs' pods hold
        taken = set()  # GPUs some live pod is bound to
        gpu_holder, slurmd = self.gpu_holder, k8s.SLURMD
        for p in self.world.kube.live_pods():
            if p.gpu is None:
                continue
            taken.add(p.gpu)
            if p.running_at is not None and p.running_at <= now:  # p.running(now): a live pod
                if gpu_holder.get(p.gpu, p.holder) != p.holder:
                    self.owner_changes += 1
                gpu_holder[p.gpu] = p.holder
            if p.holder != slurmd:
                ai_held += 1
            else:
                held += 1
                if p.owner in busy:
                    used += 1
                else:
                    idle += 1
        self.idle_gpu_s += idle
        self.held_now = held
        self.held.append(held)
        slurm_waits = any(j.finished is None for j in self.world.slurm.open_jobs)
        kube_open = self.world.kube.open_jobs
        if slurm_waits and any(j.finished is None for j in kube_open):
            ai_used = sum(len(j.pods) for j in kube_open if j.finished is None and j.started is not None)
            self.contended["seconds"] += 1
            self.contended["slurm"] += used
            self.contended["kubernetes"] += ai_used
            minute = int(now // 60)
            while len(self.contended_minutes) <= minute:
                self.contended_minutes.append([0.0, 0.0, 0.0])
            bucket = self.contended_minutes[minute]
            bucket[0], bucket[1], bucket[2] = bucket[0] + used, bucket[1] + ai_used, bucket[2] + 1
        gpus = self.world.kube.gpus
        free = gpus - len(taken)
        if idle + free:
            if self._slurm_waits(now)[1]:  # an eligible Slurm job not wider than the cluster waits
                self.idle_while_waiting["slurm"] += idle + free
                self.held_for_reservation["slurm"] += idle
            if self._ai_waits_fitting():
                self.idle_while_waiting["kubernetes"] += idle + free
                self.held_for_reservation["kubernetes"] += free
        if self.held_now == 0:
            if self.zero_spans and self.zero_spans[-1][1] == now - 1:
                self.zero_spans[-1][1] = now
            else:
                self.zero_spans.append([now, now])
        self._plan_holds(busy, now)
        shares = self.shares
        if shares is not None:
            # A side that is not below its share with the other above its own, and was not lent
            # before, has nothing to note (most seconds): _reclaim_wait is not asked.
            if (held < shares["slurm"] and ai_held > shares["kubernetes"]) or self.lent_since["slurm"] is not None:
                self._reclaim_wait("slurm", held, ai_held, shares, now)
            if (ai_held < shares["kubernetes"] and held > shares["slurm"]) or self.lent_since["kubernetes"] is not None:
                self._reclaim_wait("kubernetes", ai_held, held, shares, now)

    def _plan_holds(self, busy: frozenset[str], now: float) -> None:
        slurm = self.world.slurm
        if not slurm.plans and not self.plan_hold_since:
            return  # no plan holds a node, and none did
        held = {
            n
            for p in slurm.plans
            if p.job.state == PENDING
            for n in p.nodes
            if n not in busy and n in slurm.nodes and not slurm.nodes[n].down
        }
        for node in held - set(self.plan_hold_since):
            self.plan_hold_since[node] = now
        for node in set(self.plan_hold_since) - held:
            self.plan_hold_max_s = max(self.plan_hold_max_s, now - self.plan_hold_since.pop(node))

    def longest_plan_hold(self, now: float) -> float:
        """The longest stretch a node idled in a plan, stretches still open at `now` included."""
        return max([self.plan_hold_max_s, *(now - since for since in self.plan_hold_since.values())])

    def _reclaim_wait(self, side: str, mine: int, theirs: int, shares: dict[str, int], now: float) -> None:
        """A side waits for its lent share while it has work waiting, holds less than its share
        and the other side more than its own."""
        other = "kubernetes" if side == "slurm" else "slurm"
        lent = mine < shares[side] and theirs > shares[other] and self._waits(side, now)
        since = self.lent_since[side]
        if lent and since is None:
            self.lent_since[side] = now
        elif not lent and since is not None:
            self.reclaim_waits[side].append(now - since)
            self.lent_since[side] = None

    def _waits(self, side: str, now: float) -> bool:
        """Work of the side that could start now: an eligible Slurm job, a workload Kueue has not admitted."""
        if side == "slurm":
            return self._slurm_waits(now)[0]
        return self.world.kueue is not None and self.world.kueue.pending_gpus(AI_CLUSTER_QUEUE) > 0

    def _slurm_waits(self, now: float) -> tuple[bool, bool]:
        """Whether an eligible Slurm job waits, and one not wider than the cluster: one walk of the
        open jobs per second (`account` forgets the last second's), where both are asked."""
        if self._slurm_waiting is None:
            gpus, slurm = self.world.kube.gpus, self.world.slurm
            waits = fitting = False
            for j in slurm.open_jobs:
                if slurm.eligible(j, now):
                    waits = True
                    if j.nodes_needed <= gpus:
                        fitting = True
                        break
            self._slurm_waiting = (waits, fitting)
        return self._slurm_waiting

    def _ai_waits_fitting(self) -> bool:
        """A Kubernetes job not wider than the cluster has not started."""
        gpus = self.world.kube.gpus
        return any(j.started is None and j.finished is None and j.replicas <= gpus for j in self.world.kube.open_jobs)
