"""A tiny simulated testbed behind the `Cluster` interface, driven by a fake clock.

Four nodes with one GPU each. The device plugin gives each GPU to one pod; KEDA grows the
NodeSet while Slurm work waits and scales it to 0 a cooldown after the last job; slurmd
pods register as Slurm nodes some seconds after they start; Slurm runs FIFO-with-backfill;
PyTorchJobs run once all their pods run. Faults can be switched on to make checks fail.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from components.names import SlurmNames, slurm_names
from validation.scenarios import kube_gpus, sbatch_options
from validation.timeline import (
    FAILED,
    KUBERNETES,
    PENDING,
    RUNNING,
    SLURMD,
    SUCCEEDED,
    GpuPod,
    SlurmJob,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    holder: str
    owner: str
    created: float
    gpu: str | None = None  # UUID, once bound
    node: str = ""
    running_at: float | None = None
    done: bool = False
    slurm_ready_at: float | None = None  # slurmd only: when the Slurm node registers


@dataclass
class Job:
    job_id: str
    name: str
    nodes_wanted: int
    duration: float
    state: str = "PENDING"
    nodes: tuple[str, ...] = ()
    ends_at: float | None = None


@dataclass
class KubeJobSim:
    obj: dict
    pods: list[Pod]
    duration: float
    phase: str = PENDING
    ends_at: float | None = None


@dataclass
class Faults:
    share_gpus: bool = False  # the device plugin hands slurmd pods GPUs that are already held
    never_scale_down: bool = False  # KEDA keeps slurmd up forever
    fail_jobs: tuple[str, ...] = ()  # name prefixes of jobs that end badly
    interrupt_at: float | None = None  # Ctrl-C at this time


@dataclass
class FakeCluster:
    clock: FakeClock
    durations: dict[str, float] = field(default_factory=dict)  # by job name prefix
    faults: Faults = field(default_factory=Faults)
    names: SlurmNames = field(default_factory=lambda: slurm_names("slinky"))
    gpus: tuple[str, ...] = (
        "GPU-3f1c9a52-7d1e-4c0b-9e2a-5b8d0c6f1a01",
        "GPU-8b2e4d17-0a6c-4f3d-b1e5-2c9f7a3d4b02",
        "GPU-c47a1e93-5b2d-4e8f-a0c6-9d3b1f2e5c03",
        "GPU-e05d3b28-9f4a-4c1e-8d7b-6a2c0e9f3d04",
    )
    pod_start: float = 8.0  # bind -> Running (image pull, container start)
    slurmd_register: float = 15.0  # slurmd Running -> Slurm node idle
    cooldown: float = 300.0
    max_replicas: int = 4

    def __post_init__(self) -> None:
        self.now = 0.0
        self.replicas = 0
        self.pods: list[Pod] = []
        self.slurm: list[Job] = []
        self.kube: dict[str, KubeJobSim] = {}
        self.last_slurm_activity: float | None = None
        self.ids = itertools.count(100)
        self.uids = itertools.count(1)
        self.cancelled: list[str] = []
        self.deleted: list[str] = []
        self.uuid_reads = 0

    # ---------------------------------------------------------------- simulation

    def _duration(self, name: str) -> float:
        return next((d for prefix, d in self.durations.items() if name.startswith(prefix)), 60.0)

    def _node(self, gpu: str) -> str:
        return f"gpu-worker-{self.gpus.index(gpu)}"

    def _advance(self) -> None:
        target = self.clock.now()
        if self.faults.interrupt_at is not None and target >= self.faults.interrupt_at:
            raise KeyboardInterrupt
        while self.now < target:
            self.now = min(target, self.now + 1.0)
            self._step()

    def _step(self) -> None:
        self._keda()
        self._nodeset()
        self._bind()
        self._slurm()
        self._kube()

    def _keda(self) -> None:
        active = [j for j in self.slurm if j.state in ("PENDING", "RUNNING")]
        if active:
            self.last_slurm_activity = self.now
            busy = sum(len(j.nodes) for j in active if j.state == "RUNNING")
            largest_pending = max((j.nodes_wanted for j in active if j.state == "PENDING"), default=0)
            self.replicas = max(self.replicas, min(self.max_replicas, busy + largest_pending))
        elif (
            self.replicas
            and not self.faults.never_scale_down
            and self.last_slurm_activity is not None
            and self.now - self.last_slurm_activity >= self.cooldown
        ):
            self.replicas = 0

    def _live_slurmd(self) -> list[Pod]:
        return [p for p in self.pods if p.holder == SLURMD and not p.done]

    def _nodeset(self) -> None:
        live = self._live_slurmd()
        taken = {p.name for p in live}
        for _ in range(self.replicas - len(live)):
            index = next(i for i in itertools.count() if f"{self.names.slurmd_pod_prefix}{i}" not in taken)
            name = f"{self.names.slurmd_pod_prefix}{index}"
            taken.add(name)
            self.pods.append(
                Pod(
                    self.names.namespace,
                    name,
                    f"uid-{next(self.uids)}",
                    SLURMD,
                    f"{self.names.nodeset}-{index}",
                    self.now,
                )
            )
        busy = {n for j in self.slurm if j.state == "RUNNING" for n in j.nodes}
        for pod in sorted(live, key=lambda p: p.name, reverse=True)[: max(0, len(live) - self.replicas)]:
            if pod.owner not in busy:  # scale-in drains first: busy nodes survive
                pod.done = True

    def _held(self) -> set[str]:
        return {p.gpu for p in self.pods if p.gpu and not p.done}

    def _bind(self) -> None:
        for pod in sorted((p for p in self.pods if p.gpu is None and not p.done), key=lambda p: p.created):
            held = self._held()
            if self.faults.share_gpus and pod.holder == SLURMD:
                held = set()
            free = [g for g in self.gpus if g not in held]
            if not free:
                return
            pod.gpu, pod.node = free[0], self._node(free[0])
            pod.running_at = self.now + self.pod_start
            if pod.holder == SLURMD:
                pod.slurm_ready_at = pod.running_at + self.slurmd_register

    def _running(self, pod: Pod) -> bool:
        return not pod.done and pod.running_at is not None and pod.running_at <= self.now

    def _slurm(self) -> None:
        for job in self.slurm:
            if job.state == "RUNNING" and job.ends_at <= self.now:
                failed = job.name.startswith(self.faults.fail_jobs) if self.faults.fail_jobs else False
                job.state = "FAILED" if failed else "COMPLETED"
        ready = [p.owner for p in self._live_slurmd() if p.slurm_ready_at is not None and p.slurm_ready_at <= self.now]
        busy = {n for j in self.slurm if j.state == "RUNNING" for n in j.nodes}
        idle = [n for n in sorted(ready) if n not in busy]
        for job in self.slurm:
            if job.state == "PENDING" and len(idle) >= job.nodes_wanted:
                job.nodes, idle = tuple(idle[: job.nodes_wanted]), idle[job.nodes_wanted :]
                job.state, job.ends_at = "RUNNING", self.now + job.duration

    def _kube(self) -> None:
        for sim in self.kube.values():
            if sim.phase == PENDING and all(self._running(p) for p in sim.pods):
                sim.phase, sim.ends_at = RUNNING, self.now + sim.duration
            elif sim.phase == RUNNING and sim.ends_at <= self.now:
                name = sim.obj["metadata"]["name"]
                failed = name.startswith(self.faults.fail_jobs) if self.faults.fail_jobs else False
                sim.phase = FAILED if failed else SUCCEEDED
                for pod in sim.pods:
                    pod.done = True

    # ---------------------------------------------------------------- the Cluster interface

    def submit_slurm(self, name: str, script: str) -> str:
        self._advance()
        nodes = int(sbatch_options(script).get("--nodes", "1"))
        job = Job(str(next(self.ids)), name, nodes, self._duration(name))
        self.slurm.append(job)
        return job.job_id

    def cancel_slurm(self, job_ids: list[str]) -> None:
        self.cancelled += job_ids
        for job in self.slurm:
            if job.job_id in job_ids and job.state in ("PENDING", "RUNNING"):
                job.state = "CANCELLED"

    def slurm_jobs(self) -> list[SlurmJob]:
        self._advance()
        return [SlurmJob(j.job_id, j.name, j.state, j.nodes) for j in self.slurm]

    def create(self, obj: dict) -> None:
        self._advance()
        name = obj["metadata"]["name"]
        if obj["kind"] == "PyTorchJob":
            specs = obj["spec"]["pytorchReplicaSpecs"]
            pod_names = [
                f"{name}-{kind.lower()}-{i}"
                for kind in ("Master", "Worker")
                for i in range(specs.get(kind, {}).get("replicas", 0))
            ]
        else:
            pod_names = [f"{name}-x1y2z"]
        assert len(pod_names) == kube_gpus(obj), "every fake pod holds one GPU"
        namespace = obj["metadata"]["namespace"]
        pods = [Pod(namespace, n, f"uid-{next(self.uids)}", KUBERNETES, name, self.now) for n in pod_names]
        self.pods += pods
        self.kube[name] = KubeJobSim(obj, pods, self._duration(name))

    def delete(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        self.deleted.append(name)
        for pod in self.kube.pop(name).pods:
            pod.done = True

    def kube_job_phase(self, obj: dict) -> str:
        self._advance()
        return self.kube[obj["metadata"]["name"]].phase

    def nodeset(self) -> tuple[int, int]:
        self._advance()
        return self.replicas, sum(
            1 for p in self._live_slurmd() if p.slurm_ready_at is not None and p.slurm_ready_at <= self.now
        )

    def gpu_pods(self) -> list[GpuPod]:
        self._advance()
        return [
            GpuPod(
                namespace=p.namespace,
                name=p.name,
                uid=p.uid,
                node=p.node,
                phase="Running" if self._running(p) else "Pending",
                holder=p.holder,
                owner=p.owner,
                container="c",
            )
            for p in self.pods
            if not p.done
        ]

    def read_gpu_uuids(self, pod: GpuPod) -> tuple[str, ...]:
        self.uuid_reads += 1
        found = next(p for p in self.pods if p.uid == pod.uid)
        return (found.gpu,) if self._running(found) else ()
