"""The Slinky 1.0 NodeSet controller: slurmd pods for `.spec.replicas`, drain-first scale-in, synced
on events, its scale-in victims sorted on the annotations of its previous sync.

Followed: SlinkyProject/slurm-operator@v1.0.0 (paths under internal/controller/nodeset/ unless named);
what 1.0.5 changed is named where it applies (`drain_requeue`).
* When it syncs. On events, not on a clock (nodeset_controller.go:148-160): a change of the NodeSet
  (its replicas; its status, which every sync writes: nodeset_sync_status.go), any new version of
  one of its pods (eventhandler/eventhandler_pod.go:121-202), its own patches included, and a Slurm
  node added, deleted or changing state as the Slurm client's node informer sees it
  (eventhandler/eventhandler_pod.go:335-373). That informer lists the nodes every 30 s
  (SlinkyProject/slurm-client@v1.0.0 pkg/client/informer.go:24,105-200), at the start of every
  sync (slurmcontrol/slurmcontrol.go:63-79 RefreshNodeCache) and after each drain or undrain it
  sends (informer.go Update). Each sync mirrors the Slurm states of its pods' nodes into the pods'
  conditions and the NodeSet status (nodeset_sync_status.go:38-60,194-260), so a sync that sees
  them change causes one more; it requeues the NodeSet 10 s later while Slurm's node count differs
  from the pods' and the status changed (nodeset_sync_status.go:130-140). processCondemned's 30 s
  requeue of a draining pod is pushed under the pod's key (nodeset_sync.go:706,729) while Reconcile
  pops the NodeSet's (nodeset_controller.go:125-127), so it never fires: a drained busy node's pod
  goes when an event comes after its job has ended, the informer's next list at the latest.
  1.0.5 pushes it under the NodeSet's key (SlinkyProject/slurm-operator@v1.0.5:internal/controller/
  nodeset/nodeset_sync.go:720-721, nodeset_controller.go:127): while a condemned pod drains, the
  NodeSet syncs again 30 s after each sync (the store keeps the shortest duration pushed,
  internal/utils/durationstore), so a fresher sort may keep the busy node and condemn an idle one.
* One sync (nodeset_sync.go:216-251): RefreshNodeCache; syncSlurmDeadline (447-479) patches every
  pod's `nodeset.slinky.slurm.net/pod-deadline` to the latest start + time limit of the RUNNING
  jobs on its node (slurmcontrol.go:526-578 GetNodeDeadlines), read from the client's job cache,
  which lists the jobs every 30 s (slurm-client informer.go, client.go:548-563; the operator sets
  no CacheSyncPeriod); then syncNodeSet (486-512) on the pods as listed at the start of the sync.
  So the scale-in sort reads the deadlines the *previous* sync wrote, from a job list up to 30 s
  older still: a node whose job started after that list looks idle.
* The sort (utils/sort.go:33-99 ActivePods.Less): unassigned first, Pending before Running, not
  ready before ready, lower `nodeset.slinky.slurm.net/pod-deletion-cost` (api/v1beta1/
  well_known.go:24; neither the operator nor the program writes it, so it is 0 on every pod and
  never decides), earlier pod-deadline (none = the zero time, first), cordoned
  (`nodeset.slinky.slurm.net/pod-cordon`) first, then the highest ordinal. Less answers true both
  ways for two cordoned pods; the twin breaks that tie by ordinal, as 1.0.5 does
  (SlinkyProject/slurm-operator@v1.0.5:internal/controller/nodeset/utils/sort.go:73). Ready is Running here: slurmd's
  readiness probe (internal/builder/worker_app.go:142-148) asks /readyz, which answers while
  slurmd serves RPCs (SchedMD/slurm@slurm-25-11-0-1 src/slurmd/slurmd/http.c:91-99), before it
  registers and until its container stops.
* The pods a sync counts include terminating ones (kubernetes ClaimPods keeps them; no filter in
  nodeset_sync.go:79,497): they count toward `.spec.replicas`, and processCondemned skips one
  (nodeset_sync.go:713-717). Scale-out un-cordons and un-drains every pod, then creates pods at
  the lowest free ordinals (doPodScaleOut, 516-598); scale-in un-cordons the pods kept and, for
  each condemned one, cordons it and drains its Slurm node, or deletes it once `IsNodeDrained`
  (doPodScaleIn, processCondemned, makePodCordonAndDrain: 620-742, 806-821).
* A slurmd pod gated by Kueue is an active pod like any other: it counts toward `.spec.replicas`,
  and as unassigned and Pending it is condemned first on scale-in.
* slurmcontrol/slurmcontrol.go: with no Slurm client, MakeNodeDrain does nothing, IsNodeDrained
  returns true and GetNodeDeadlines is empty, so that sync removes every deadline.
  internal/controller/slurmclient/slurmclient_sync.go:53-58: the client exists only while the
  restapi Deployment has a ready replica; a new one lists jobs and nodes afresh.
* internal/builder/worker_app.go:160-170: slurmd's preStop sets its Slurm node down
  (`twin.slurm.node_gone`).
* Kueue down (`refused`). Kueue's pod webhooks are mpod.kb.io (CREATE) and vpod.kb.io (CREATE,
  UPDATE), failurePolicy Fail with `pod` on (kubernetes-sigs/kueue@v0.19.2:
  charts/kueue/templates/webhook/manifests.yaml:313-339,977-1004; pkg/controller/jobs/pod/
  pod_webhook.go:84,197), and the program narrows both to pods with the queue label
  (components/kueue.py), which every slurmd pod carries. While Kueue is down the API server
  refuses every create and update of a slurmd pod: a no-op patch too, since validating admission
  runs on every update before the store compares bytes (kubernetes/kubernetes@v1.34.0:
  staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go Update). So the first
  deadline patch fails, SlowStartBatch stops (internal/utils/tools.go:29-55) and the sync returns
  before syncCordon and syncNodeSet: no pod is created, cordoned, drained, un-drained or deleted.
  A delete would not be refused (no webhook has DELETE), and neither would a drain (slurmrestd),
  but the sync never reaches them; were it to, the cordon patch comes before the drain and the
  delete (makePodCordonAndDrain) and would stop both. With no pod, the create is refused. A
  failed sync is retried by controller-runtime after 5 ms doubling per failure, at most 1000 s
  (k8s.io/client-go@v0.34.1 util/workqueue/default_rate_limiters.go
  DefaultTypedControllerRateLimiter; sigs.k8s.io/controller-runtime@v0.22.4 reconcileHandler:
  AddRateLimited on error, Forget on success; its 10 qps bucket never binds here), or by the
  next event, whichever comes first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twin.kube import SLURMD, Kubernetes, Pod
from twin.slurm import Slurmctld

SLURMD_REGISTER = 15.0  # slurmd Running -> Slurm node registered (assumption)
INFORMER_PERIOD = 30.0  # slurm-client@v1.0.0 defaultSyncPeriod: each informer lists this often
INFORMER_PHASE = 0.0  # where in each period the informers list (assumption; tests sweep it)
STATUS_RESYNC = 10.0  # nodeset_sync_status.go: requeue while Slurm's node count is not the pods'
DRAIN_REQUEUE = 30.0  # processCondemned: requeue while a condemned pod drains (fires from 1.0.5)
BACKOFF_BASE, BACKOFF_MAX = 0.005, 1000.0  # client-go's per-item exponential failure backoff


@dataclass
class NodeSetController:
    pod_prefix: str  # slurm-worker-slinky
    host_prefix: str  # slinky (the Slurm node name is <host_prefix>-<ordinal>)
    kube: Kubernetes
    slurm: Slurmctld
    replicas: int = 0
    starts: int = 0
    register_delay: float = SLURMD_REGISTER
    # When the client's informers list, after their first list at its creation: at this offset
    # into each INFORMER_PERIOD from then (their tickers start when the client's Start loop runs
    # them: slurm-client client.go Start), independent of the scrape, poll and sync clocks.
    informer_phase: float = INFORMER_PHASE
    # processCondemned's 30 s requeue fires (1.0.5 and later; 1.0.0-1.0.4 push it under the pod's key)
    drain_requeue: bool = True
    # The Slurm client: since when it exists, and its two caches (node -> latest job deadline;
    # node -> (busy, drain, down)).
    _client_since: float | None = None
    _jobs_seen: dict[str, float] = field(default_factory=dict)
    _nodes_seen: dict[str, tuple[bool, bool, bool]] = field(default_factory=dict)
    _seen: tuple = ()  # the replicas and the pods as the last sync read them
    _status: tuple = ()  # the NodeSet status and pod conditions the last sync wrote
    _event: bool = False  # an event enqueued the NodeSet since its last sync
    _requeue_at: float | None = None  # the earliest delayed add waiting in the work queue
    _failures: int = 0  # failed syncs since the last one that succeeded
    _draining: bool = False  # the last sync left a condemned pod draining
    # (when, Slurm node) of each un-drain that gives a condemned node back to Slurm: fewer pods are
    # condemned than at the last sync. One for one re-chosen victims (a swap) is left out.
    undrained: list[tuple[float, str]] = field(default_factory=list)
    _condemned: int = 0  # pods the last sync condemned
    # `pods` as of the Kubernetes live_version it was filtered at: asked every second, it changes
    # only when a pod is made or goes. Callers only read it.
    _pods: tuple[int, list[Pod]] = field(default=(-1, []), compare=False, repr=False)

    def pods(self) -> list[Pod]:
        """The NodeSet's pods as a sync lists them: every live one, terminating ones included."""
        live = self.kube.live_pods()
        if self._pods[0] != self.kube.live_version:
            self._pods = (self.kube.live_version, [p for p in live if p.holder == SLURMD])
        return self._pods[1]

    def _ordinal(self, pod: Pod) -> int:
        return int(pod.name.rsplit("-", 1)[1])

    def reconcile(self, now: float, client: bool, refused: bool = False) -> list[str]:
        """One second: slurmd registers, the Slurm client's informers list, and the controller syncs
        if an event or a requeue is due. Returns the Slurm jobs killed by pods deleted under them.
        `client`: slurmrestd has a ready replica; `refused`: Kueue's pod webhooks, failing closed,
        refuse every create and update of a slurmd pod."""
        pods = self.pods()  # neither registering nor the informers' lists change the pods
        for pod in pods:
            if pod.gpu in self.kube.failed:
                continue  # its node is NotReady: slurmd is not there to register
            running_at = pod.running_at if pod.running(now) else None
            if pod.terminating_at is None and running_at is not None and now >= running_at + self.register_delay:
                self.slurm.register(pod.owner, now)
        self._informers(now, client)
        due = self._requeue_at is not None and now >= self._requeue_at
        if not (due or self._event or self._observed(pods, now) != self._seen):
            return []
        if due:
            self._requeue_at = None
        return self._sync(now, client, refused, pods)

    def _informers(self, now: float, client: bool) -> None:
        if not client:
            self._client_since = None  # ClientMap.Remove: the client goes, and its caches with it
            self._jobs_seen, self._nodes_seen = {}, {}
            return
        if self._client_since is None:
            self._client_since = now  # a new client lists at once: each node it finds is an event
        elif (now - self._client_since - self.informer_phase) % INFORMER_PERIOD:
            return
        if not self.slurm.up:
            return  # the list fails (slurmrestd cannot reach slurmctld): the caches stay as they were
        self._jobs_seen = self.slurm.deadlines()
        self._event |= self._list_nodes()

    def _list_nodes(self) -> bool:
        """The node informer lists the Slurm nodes; True when one was added, deleted or changed state."""
        busy = self.slurm.busy_nodes()
        view = {n.name: (n.name in busy, n.drain, n.down) for n in self.slurm.nodes.values()}
        changed, self._nodes_seen = view != self._nodes_seen, view
        return changed

    def _observed(self, pods: list[Pod], now: float) -> tuple:
        """What a watch sees change: the replicas, and each pod's binding, gate, phase, deletion and
        annotations."""
        return (
            self.replicas,
            tuple(
                [
                    (p.name, p.gpu, p.gated, p.running(now), p.terminating_at is not None, p.deadline, p.cordon)
                    for p in pods
                ]
            ),
        )

    def _sync(self, now: float, client: bool, refused: bool, pods: list[Pod]) -> list[str]:
        self._event = False
        self._seen = self._observed(pods, now)
        # RefreshNodeCache, the sync's first step, lists the nodes afresh and waits for it; with
        # slurmctld down the list fails and so does the sync, before it changes anything
        # (SlinkyProject/slurm-operator@v1.0.5: internal/controller/nodeset/nodeset_sync.go sync,
        # slurmcontrol/slurmcontrol.go RefreshNodeCache; SlinkyProject/slurm-client@v1.0.5:
        # pkg/client/informer.go List, WaitForSyncList). Without a client it returns nil.
        unreachable = client and not self.slurm.up
        if client and not unreachable:
            self._event |= self._list_nodes()
        # The sort reads the pods as listed: the deadlines the previous sync wrote.
        keys = {p.name: self._victim_key(p, now) for p in pods}
        killed: list[str] = []
        failed = unreachable or (refused and bool(pods))  # or syncSlurmDeadline's first patch is refused
        if not failed:
            for pod in pods:
                pod.deadline = self._jobs_seen.get(pod.owner) if client else None
            killed, failed = self._sync_nodeset(now, client, refused, pods, keys)
        status_changed, slurm_nodes = self._sync_status(now, client, pods)
        if failed:
            self._backoff(now)  # a requeue the sync asked for is dropped with the error
        else:
            self._failures = 0
            if status_changed and slurm_nodes != len(pods):
                self._requeue(now + STATUS_RESYNC)
            if self._draining and self.drain_requeue:
                self._requeue(now + DRAIN_REQUEUE)
        return killed

    def _sync_nodeset(
        self, now: float, client: bool, refused: bool, pods: list[Pod], keys: dict[str, tuple]
    ) -> tuple[list[str], bool]:
        """syncNodeSet: (the jobs killed, whether a create was refused)."""
        killed: list[str] = []
        self._draining = False
        condemned_before, self._condemned = self._condemned, max(0, len(pods) - self.replicas)
        if len(pods) < self.replicas:
            for pod in pods:
                self._uncordon(pod, client, now)
            if refused:
                return killed, True
            used = {self._ordinal(p) for p in pods}
            ordinal = 0
            for _ in range(self.replicas - len(pods)):
                while ordinal in used:
                    ordinal += 1
                used.add(ordinal)
                self.kube.create_pod(
                    Pod(f"{self.pod_prefix}-{ordinal}", SLURMD, f"{self.host_prefix}-{ordinal}", "slurmd", now)
                )
                self.starts += 1
        elif len(pods) > self.replicas:
            ordered = sorted(pods, key=lambda p: keys[p.name])
            condemned, kept = ordered[: len(pods) - self.replicas], ordered[len(pods) - self.replicas :]
            for pod in kept:
                self._uncordon(pod, client, now, swap=len(condemned) >= condemned_before)
            for pod in condemned:
                if pod.terminating_at is not None:
                    continue
                drained = not client or self.slurm.is_drained(pod.owner)
                if pod.running(now) and not drained:
                    pod.cordon = True
                    self._set_drain(pod, True, client)
                    self._draining = True
                    continue
                self.kube.delete(pod, now)
                killed += [j.spec.name for j in self.slurm.node_gone(pod.owner, now)]
        else:
            for pod in pods:
                self._uncordon(pod, client, now)
        return killed, False

    def _uncordon(self, pod: Pod, client: bool, now: float, swap: bool = False) -> None:
        pod.cordon = False
        node = self.slurm.nodes.get(pod.owner)
        if client and node is not None and node.drain and not swap:
            self.undrained.append((now, pod.owner))
        self._set_drain(pod, False, client)

    def _set_drain(self, pod: Pod, drain: bool, client: bool) -> None:
        """MakeNodeDrain / MakeNodeUndrain through the client; the informer lists again after it."""
        node = self.slurm.nodes.get(pod.owner)
        if client and node is not None and node.drain != drain:
            self.slurm.set_drain(pod.owner, drain)
            self._event |= self._list_nodes()

    def _sync_status(self, now: float, client: bool, pods: list[Pod]) -> tuple[bool, int]:
        """syncStatus, on the pods the sync listed: it lists the Slurm nodes again, then writes the
        NodeSet status and each pod's Slurm-state conditions; a change is an update event (one
        more sync). Returns whether they changed and CalculateNodeStatus's Total (the pods' Slurm
        nodes; none without a client)."""
        if client and self.slurm.up:
            self._event |= self._list_nodes()
        states = tuple(self._nodes_seen.get(p.owner) for p in pods)
        status = (len(pods), sum(1 for p in pods if p.running(now)), states)
        changed, self._status = status != self._status, status
        self._event |= changed
        return changed, sum(1 for state in states if state is not None)

    def _backoff(self, now: float) -> None:
        """AddRateLimited: the retries that fall within this second fail as well."""
        at = now
        while at < now + 1:
            at += min(BACKOFF_BASE * 2**self._failures, BACKOFF_MAX)
            self._failures += 1
        self._requeue(at)

    def _requeue(self, at: float) -> None:
        # client-go's delaying queue keeps the earliest time an item is waiting for
        self._requeue_at = at if self._requeue_at is None else min(self._requeue_at, at)

    def _victim_key(self, pod: Pod, now: float) -> tuple:
        return (
            pod.gpu is not None,  # unassigned first
            pod.running(now),  # Pending before Running, not ready before ready (Ready = Running)
            pod.deadline is not None,  # no deadline (the zero time) before any
            pod.deadline or 0.0,
            not pod.cordon,  # cordoned first
            -self._ordinal(pod),  # highest ordinal first
        )
