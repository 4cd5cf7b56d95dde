"""The validation runner's simulated testbed: the hand-off twin (`twin/`) behind the `Cluster`
interface, driven by a fake clock. One simulator, not two: Slurm, Prometheus, KEDA + HPA running
the program's own ScaledObject, the NodeSet controller and Kubernetes all come from the twin.

Faults that make the checks fail: a device plugin that double-books GPUs for slurmd pods, a
KEDA that never scales down, jobs that end badly, Ctrl-C at a given time; and the ones a run
must survive or catch: an API server that is down for a while or flaky, a lost sbatch
reply, a previous run's slurmd still up, a pod without a GPU request running on a GPU, a
process probe that never answers, a toolkit that lets the leak probe reach a GPU.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from core import settings
from core.names import SlurmNames, slurm_names
from stacks import offline
from twin import program, sim
from twin.kube import SLURMD
from twin.scenario import JobSpec, Scenario
from twin.slurm import COMPLETED
from validation.cluster import ClusterError
from validation.scenarios import kube_gpus, sbatch_options
from validation.timeline import FAILED, PENDING, RUNNING, SUCCEEDED, DcgmHolding, GpuPod, GpuProcess, SlurmJob

FOREVER = 10**7
LEAK_POD_UID = "uid-leak"


def all_reduce_output(busbw: float, wrong: int = 0) -> str:
    """The end of an all-reduce's output as nccl-tests prints it (NVIDIA/nccl-tests@v2.17.7:src/util.cu
    writeResultFooter: "# %-20s : %d %s", "# %-20s : %g %s"); the PyTorchJob prints the same."""
    status = "FAILED" if wrong else "OK"
    return (
        "#       size         count      type   redop    root     time   algbw   busbw #wrong\n"
        f"    67108864      16777216     float     sum      -1   57801.2    1.16    {busbw:g}      {wrong}\n"
        f"# {'Out of bounds values':<20} : {wrong} {status}\n"
        f"# {'Avg bus bandwidth':<20} : {busbw:g} \n"
    )


# By job-name prefix: what each all-reduce of the nccl scenario writes.
ALL_REDUCE_OUTPUTS = {"nccl-allreduce": all_reduce_output(1.16), "pytorchjob-nccl-allreduce": all_reduce_output(0.97)}


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def epoch(self) -> float:
        return self.t  # the fake cluster keeps time on this clock too

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Faults:
    share_gpus: bool = False  # the device plugin time-slices each GPU between two pods (replicas 2)
    never_scale_down: bool = False  # KEDA keeps slurmd up forever
    fail_jobs: tuple[str, ...] = ()  # name prefixes of jobs that end badly
    interrupt_at: float | None = None  # Ctrl-C at this time
    api_down: tuple[float, float] | None = None  # every call in [from, to) fails
    flaky_pod_lists: int = 0  # every Nth pod list fails
    unreachable: bool = False  # the API server never answers
    leftover_slurmd_until: float | None = None  # a previous run's slurmd holds a GPU until then
    lost_sbatch_reply: bool = False  # the first sbatch queues its job but the reply is lost
    leak_from: float | None = None  # from then on a pod without a GPU request runs on a held GPU
    no_probe: bool = False  # the process probe never answers
    leaky_toolkit: bool = False  # a pod without a GPU request reaches a GPU (the default toolkit)


class FakeClusterError(ClusterError):
    """What the fake raises for an injected fault."""


@functools.cache
def _settings(overrides: tuple[str, ...]) -> settings.Settings:
    return offline.stack_settings("dev", list(overrides))


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
    outputs: dict[str, str] = field(default_factory=lambda: dict(ALL_REDUCE_OUTPUTS))  # by job-name prefix

    def __post_init__(self) -> None:
        s = _settings(
            (
                f"nodesetName={self.names.nodeset}",
                f"kedaCooldownSeconds={int(self.cooldown)}",
                f"kedaMaxReplicas={self.max_replicas}",
                "hpcBorrowsAiGpus=true",  # slurmd may take every worker's GPU, as these runs assume
            )
        )
        self.twin = sim.Run(program.setup(s), Scenario(duration=FOREVER, workers=s.worker_count))
        self.twin.kube.container_start = self.pod_start
        self.twin.nodeset.register_delay = self.slurmd_register
        self.twin.kube.gpu_replicas = 2 if self.faults.share_gpus else 1
        self.next_tick = 0
        self.floor = 0  # never_scale_down: the most replicas seen
        self.namespaces: dict[str, str] = {}
        self.uids: dict[int, str] = {}
        self.uid_counter = itertools.count(1)
        self.cancelled: list[str] = []
        self.deleted: list[str] = []
        self.uuid_reads = 0
        self.pod_lists = 0
        self.interrupted = False
        self.sbatch_calls = 0
        self.probe_calls: list[str] = []
        self.plain_jobs: dict[str, str] = {}  # Jobs without a GPU request: name -> their pod's uid
        self.output_reads: list[tuple[str, str, str]] = []

    # ---------------------------------------------------------------- the twin on the fake clock

    def _duration(self, name: str) -> float:
        return next((d for prefix, d in self.durations.items() if name.startswith(prefix)), 60.0)

    def _call(self) -> None:
        """Every call through the Cluster interface: injected API faults, then time moves on."""
        window = self.faults.api_down
        if self.faults.unreachable or (window and window[0] <= self.clock.now() < window[1]):
            raise FakeClusterError("fake: the API server does not answer")
        self._advance()

    def _advance(self) -> None:
        target = self.clock.now()
        if self.faults.interrupt_at is not None and target >= self.faults.interrupt_at and not self.interrupted:
            self.interrupted = True  # one Ctrl-C
            raise KeyboardInterrupt
        while self.next_tick <= target:
            self.twin.tick(self.next_tick)
            self.next_tick += 1
            if self.faults.never_scale_down:
                self.floor = max(self.floor, self.twin.nodeset.replicas)
                self.twin.nodeset.replicas = self.floor
            leftover = self.faults.leftover_slurmd_until
            if leftover is not None and self.next_tick <= leftover:
                self.twin.nodeset.replicas = max(1, self.twin.nodeset.replicas)

    def _failed(self, name: str) -> bool:
        return bool(self.faults.fail_jobs) and name.startswith(self.faults.fail_jobs)

    def _uid(self, pod) -> str:
        return self.uids.setdefault(id(pod), f"uid-{next(self.uid_counter)}")

    # ---------------------------------------------------------------- the Cluster interface

    def submit_slurm(self, name: str, script: str) -> str:
        self._call()
        nodes = int(sbatch_options(script).get("--nodes", "1"))
        self.twin.submit(JobSpec(name, "slurm", self.clock.now(), self._duration(name), nodes=nodes), self.clock.now())
        self.sbatch_calls += 1
        if self.faults.lost_sbatch_reply and self.sbatch_calls == 1:
            raise FakeClusterError(
                "fake: exec sh in slurm/slurm-controller-0: the stream closed without an exit status"
            )
        return str(self.twin.slurm_jobs[name][0].job_id)

    def cancel_slurm(self, job_ids: list[str]) -> None:
        self._call()
        self.cancelled += job_ids
        for job in self.twin.slurm.jobs:
            if str(job.job_id) in job_ids:
                self.twin.slurm.cancel(job, self.clock.now())

    def slurm_jobs(self) -> list[SlurmJob]:
        self._call()
        out = []
        for j in self.twin.slurm.jobs:
            state = "FAILED" if j.state == COMPLETED and self._failed(j.spec.name) else j.state
            out.append(SlurmJob(str(j.job_id), j.spec.name, state, j.nodes if j.state == "RUNNING" else ()))
        return out

    def create(self, obj: dict) -> None:
        self._call()
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
        if gpus == 0:  # its pod asks for no GPU: the twin runs it without one
            self.plain_jobs[name] = f"uid-plain-{next(self.uid_counter)}"

    def delete(self, obj: dict) -> None:
        self._call()
        name = obj["metadata"]["name"]
        self.deleted.append(name)
        self.twin.kube.delete_job(name, self.clock.now())

    def kube_job_phase(self, obj: dict) -> str:
        self._call()
        job = self.twin.kube_jobs[obj["metadata"]["name"]]
        if job.finished is not None:
            leaked = job.name in self.plain_jobs and self.faults.leaky_toolkit  # the leak probe saw a GPU
            return FAILED if self._failed(job.name) or leaked else SUCCEEDED
        return RUNNING if job.started is not None else PENDING

    def nodeset(self) -> tuple[int, int]:
        self._call()
        ready = sum(1 for p in self.twin.nodeset.pods() if p.owner in self.twin.slurm.nodes)
        return self.twin.nodeset.replicas, ready

    def gpu_pods(self) -> list[GpuPod]:
        self._call()
        self.pod_lists += 1
        if self.faults.flaky_pod_lists and self.pod_lists % self.faults.flaky_pod_lists == 0:
            raise FakeClusterError("fake: list pods: 503 Service Unavailable")
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
                scheduled=p.gpu is not None,
            )
            for p in self.twin.kube.pods
            if p.live
        ]

    def read_gpu_uuids(self, pod: GpuPod) -> tuple[str, ...]:
        self.uuid_reads += 1
        found = next(p for p in self.twin.kube.pods if self._uid(p) == pod.uid)
        return (sim.gpu_uuid(found.gpu),) if found.running(self.clock.now()) else ()

    def job_output(self, kind: str, name: str, ref: str) -> str:
        self._call()
        self.output_reads.append((kind, name, ref))
        found = [text for prefix, text in self.outputs.items() if name.startswith(prefix)]
        if not found:
            raise FakeClusterError(f"fake: no output for {name}")
        return found[0]

    def check_reachable(self) -> None:
        self._call()

    def start_probe(self) -> None:
        self._call()
        self.probe_calls.append("start")

    def stop_probe(self) -> None:
        self._call()
        self.probe_calls.append("stop")

    def dcgm_holdings(self, t0_epoch: float, duration: float, step: float) -> list[DcgmHolding]:
        """What dcgm-exporter's pod label said, from the twin's own allocations (times since t0)."""
        self._call()
        now = self.clock.now()
        return [
            DcgmHolding(
                sim.gpu_uuid(p.gpu),
                f"{self.names.namespace if p.holder == SLURMD else self.namespaces[p.owner]}/{p.name}",
                p.running_at - t0_epoch,
                min(x for x in (p.terminating_at, p.gone_at, now) if x is not None) - t0_epoch,
            )
            for p in self.twin.kube.pods
            if p.gpu is not None and p.running_at is not None and t0_epoch <= p.running_at <= now
        ]

    def gpu_processes(self) -> tuple[list[GpuProcess], bool]:
        """What nvidia-smi would list: a process per running Kubernetes pod, and per slurmd pod
        running a Slurm job; plus the injected leaks."""
        self._call()
        if self.faults.no_probe:
            return [], False
        now = self.clock.now()
        busy = {n for j in self.twin.slurm.jobs if j.state == "RUNNING" for n in j.nodes}
        found = [
            GpuProcess(sim.gpu_uuid(p.gpu), 1000 + i, f"gpu-worker-{p.gpu}", self._uid(p))
            for i, p in enumerate(self.twin.kube.pods)
            if p.gpu is not None and p.running(now) and (p.holder != SLURMD or p.owner in busy)
        ]
        if self.faults.leak_from is not None and now >= self.faults.leak_from and found:
            found.append(GpuProcess(found[0].uuid, 4242, found[0].node, LEAK_POD_UID))
        if self.faults.leaky_toolkit and found:
            for name, uid in self.plain_jobs.items():
                job = self.twin.kube_jobs[name]
                if job.started is not None and job.finished is None:
                    found.append(GpuProcess(found[0].uuid, 4343, found[0].node, uid))
        return found, True
