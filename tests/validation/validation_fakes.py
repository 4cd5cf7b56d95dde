"""The validation runner's simulated testbed: the hand-off twin (`twin/`) behind the `Cluster`
interface, driven by a fake clock. One simulator, not two: Slurm, Prometheus, KEDA + HPA running
the program's own ScaledObject, the NodeSet controller and Kubernetes all come from the twin.

Faults that make the checks fail: a device plugin that double-books GPUs for slurmd pods, a
KEDA that never scales down, jobs that end badly, Ctrl-C at a given time.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from components.names import SlurmNames, slurm_names
from stacks import offline, settings
from twin import program, sim
from twin.kube import SLURMD
from twin.scenario import JobSpec, Scenario
from twin.slurm import COMPLETED
from validation.scenarios import kube_gpus, sbatch_options
from validation.timeline import FAILED, PENDING, RUNNING, SUCCEEDED, GpuPod, SlurmJob

FOREVER = 10**7


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Faults:
    share_gpus: bool = False  # the device plugin hands slurmd pods GPUs that are already held
    never_scale_down: bool = False  # KEDA keeps slurmd up forever
    fail_jobs: tuple[str, ...] = ()  # name prefixes of jobs that end badly
    interrupt_at: float | None = None  # Ctrl-C at this time


@functools.cache
def _settings(overrides: tuple[str, ...]) -> settings.Settings:
    return settings.load(offline.stack_config("dev", list(overrides)), "dev", offline=True)


@dataclass
class FakeCluster:
    clock: FakeClock
    durations: dict[str, float] = field(default_factory=dict)  # by job name prefix
    faults: Faults = field(default_factory=Faults)
    names: SlurmNames = field(default_factory=lambda: slurm_names("slinky"))
    pod_start: float = 8.0  # bind -> Running (image pull, container start)
    slurmd_register: float = 15.0  # slurmd Running -> Slurm node idle
    cooldown: float = 300.0
    max_replicas: int = 4

    def __post_init__(self) -> None:
        s = _settings(
            (
                f"nodesetName={self.names.nodeset}",
                f"kedaCooldownSeconds={int(self.cooldown)}",
                f"kedaMaxReplicas={self.max_replicas}",
            )
        )
        self.twin = sim.Run(program.setup(s), Scenario(duration=FOREVER, workers=s.worker_count))
        self.twin.kube.container_start = self.pod_start
        self.twin.nodeset.register_delay = self.slurmd_register
        self.twin.kube.double_books_slurmd = self.faults.share_gpus
        self.next_tick = 0
        self.floor = 0  # never_scale_down: the most replicas seen
        self.namespaces: dict[str, str] = {}
        self.uids: dict[int, str] = {}
        self.uid_counter = itertools.count(1)
        self.cancelled: list[str] = []
        self.deleted: list[str] = []
        self.uuid_reads = 0

    # ---------------------------------------------------------------- the twin on the fake clock

    def _duration(self, name: str) -> float:
        return next((d for prefix, d in self.durations.items() if name.startswith(prefix)), 60.0)

    def _advance(self) -> None:
        target = self.clock.now()
        if self.faults.interrupt_at is not None and target >= self.faults.interrupt_at:
            raise KeyboardInterrupt
        while self.next_tick <= target:
            self.twin.tick(self.next_tick)
            self.next_tick += 1
            if self.faults.never_scale_down:
                self.floor = max(self.floor, self.twin.nodeset.replicas)
                self.twin.nodeset.replicas = self.floor

    def _failed(self, name: str) -> bool:
        return bool(self.faults.fail_jobs) and name.startswith(self.faults.fail_jobs)

    def _uid(self, pod) -> str:
        return self.uids.setdefault(id(pod), f"uid-{next(self.uid_counter)}")

    # ---------------------------------------------------------------- the Cluster interface

    def submit_slurm(self, name: str, script: str) -> str:
        self._advance()
        nodes = int(sbatch_options(script).get("--nodes", "1"))
        self.twin.submit(JobSpec(name, "slurm", self.clock.now(), self._duration(name), nodes=nodes), self.clock.now())
        return str(self.twin.slurm_jobs[name][0].job_id)

    def cancel_slurm(self, job_ids: list[str]) -> None:
        self.cancelled += job_ids
        for job in self.twin.slurm.jobs:
            if str(job.job_id) in job_ids:
                self.twin.slurm.cancel(job, self.clock.now())

    def slurm_jobs(self) -> list[SlurmJob]:
        self._advance()
        out = []
        for j in self.twin.slurm.jobs:
            state = "FAILED" if j.state == COMPLETED and self._failed(j.spec.name) else j.state
            out.append(SlurmJob(str(j.job_id), j.spec.name, state, j.nodes if j.state == "RUNNING" else ()))
        return out

    def create(self, obj: dict) -> None:
        self._advance()
        name = obj["metadata"]["name"]
        kind = "pytorchjob" if obj["kind"] == "PyTorchJob" else "job"
        gpus = kube_gpus(obj)
        spec = (
            JobSpec(name, kind, self.clock.now(), self._duration(name), replicas=gpus)
            if kind == "pytorchjob"
            else (JobSpec(name, kind, self.clock.now(), self._duration(name), gpus=gpus))
        )
        self.twin.submit(spec, self.clock.now())
        self.namespaces[name] = obj["metadata"]["namespace"]

    def delete(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        self.deleted.append(name)
        self.twin.kube.delete_job(name, self.clock.now())

    def kube_job_phase(self, obj: dict) -> str:
        self._advance()
        job = self.twin.kube_jobs[obj["metadata"]["name"]]
        if job.finished is not None:
            return FAILED if self._failed(job.name) else SUCCEEDED
        return RUNNING if job.started is not None else PENDING

    def nodeset(self) -> tuple[int, int]:
        self._advance()
        ready = sum(1 for p in self.twin.nodeset.pods() if p.owner in self.twin.slurm.nodes)
        return self.twin.nodeset.replicas, ready

    def gpu_pods(self) -> list[GpuPod]:
        self._advance()
        now = self.clock.now()
        return [
            GpuPod(
                namespace=self.names.namespace if p.holder == SLURMD else self.namespaces[p.owner],
                name=p.name,
                uid=self._uid(p),
                node=f"gpu-worker-{p.gpu}" if p.gpu is not None else "",
                phase="Running" if p.running(now) else "Pending",
                holder=p.holder,
                owner=p.owner,
                container="c",
            )
            for p in self.twin.kube.pods
            if p.live
        ]

    def read_gpu_uuids(self, pod: GpuPod) -> tuple[str, ...]:
        self.uuid_reads += 1
        found = next(p for p in self.twin.kube.pods if self._uid(p) == pod.uid)
        return (sim.gpu_uuid(found.gpu),) if found.running(self.clock.now()) else ()
