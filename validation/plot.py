"""The picture of the hand-off: one lane per GPU coloured by owner, slurmd replicas beneath."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from validation.timeline import Timeline, gpu_owner, gpu_uuids, node_of_uuid

IDLE_COLOUR = "#eeeeee"
SLURMD_IDLE_COLOUR = "#9ecae1"  # slurmd holds the GPU but runs no Slurm job (cooldown)
SLURM_COLOURS = ["#08306b", "#4292c6", "#17becf", "#2c7fb8", "#1f4e79", "#6baed6"]
KUBE_COLOURS = ["#2ca02c", "#ff7f0e", "#9467bd", "#d62728", "#8c564b", "#e377c2"]


def segments(timeline: Timeline, uuid: str) -> list[tuple[float, float, str, str]]:
    """(start, end, category, label) runs of one GPU's owner; each sample lasts until the next."""
    runs: list[list] = []
    samples = timeline.samples
    for i, sample in enumerate(samples):
        end = samples[i + 1].t if i + 1 < len(samples) else sample.t + timeline.interval
        owner = gpu_owner(sample, uuid) or ("idle", "idle")
        if runs and (runs[-1][2], runs[-1][3]) == owner and runs[-1][1] == sample.t:
            runs[-1][1] = end
        else:
            runs.append([sample.t, end, *owner])
    return [tuple(r) for r in runs]


def colours(timeline: Timeline) -> dict[tuple[str, str], str]:
    """A stable colour per owner: blues for Slurm jobs, greens and oranges for Kubernetes."""
    owners: list[tuple[str, str]] = []
    for uuid in gpu_uuids(timeline):
        for _, _, category, label in segments(timeline, uuid):
            if (category, label) not in owners:
                owners.append((category, label))
    mapping = {("idle", "idle"): IDLE_COLOUR}
    slurm = sorted(label for category, label in owners if category == "slurm-job")
    kube = sorted(label for category, label in owners if category == "kubernetes")
    mapping.update({("slurm-job", n): SLURM_COLOURS[i % len(SLURM_COLOURS)] for i, n in enumerate(slurm)})
    mapping.update({("kubernetes", n): KUBE_COLOURS[i % len(KUBE_COLOURS)] for i, n in enumerate(kube)})
    for category, label in owners:
        if category == "slurmd-idle":
            mapping[(category, label)] = SLURMD_IDLE_COLOUR
    return mapping


def draw(timeline: Timeline, path: Path, title: str | None = None) -> None:
    uuids = gpu_uuids(timeline)
    nodes = node_of_uuid(timeline)
    palette = colours(timeline)
    fig, (lanes, scale) = plt.subplots(
        2,
        1,
        figsize=(11, 1.2 + 0.55 * max(len(uuids), 1) + 1.6),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(uuids), 1), 1.6]},
    )
    for row, uuid in enumerate(uuids):
        for start, end, category, label in segments(timeline, uuid):
            lanes.broken_barh(
                [(start, end - start)],
                (row - 0.4, 0.8),
                color=palette[(category, label)],
                hatch="//" if category == "slurmd-idle" else None,
                edgecolor="white",
                linewidth=0.3,
            )
    lanes.set_yticks(range(len(uuids)), [f"{nodes[u]}\n{u[:12]}…" for u in uuids], fontsize=7)
    lanes.invert_yaxis()
    lanes.set_title(title or f"GPU owners over time: scenario {timeline.scenario}", fontsize=10)

    legend = []
    for (category, label), colour in palette.items():
        if category == "slurmd-idle":
            continue
        text = {"idle": "idle (no pod)", "slurm-job": f"Slurm job {label}", "kubernetes": f"Kubernetes {label}"}[
            category
        ]
        legend.append(Patch(facecolor=colour, label=text))
    if any(c == "slurmd-idle" for c, _ in palette):
        legend.append(Patch(facecolor=SLURMD_IDLE_COLOUR, hatch="//", label="slurmd pod, no Slurm job"))
    lanes.legend(handles=legend, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)

    times = [s.t for s in timeline.samples]
    pending = [sum(j.phase == "pending" for j in s.slurm_jobs) for s in timeline.samples]
    # Pending first and wide, so the replica lines drawn over it stay readable where they meet.
    scale.step(times, pending, where="post", linewidth=4, alpha=0.35, color="#d62728", label="Slurm jobs pending")
    scale.step(
        times, [s.nodeset_replicas for s in timeline.samples], where="post", color="#08306b", label="NodeSet replicas"
    )
    scale.step(
        times,
        [s.slurmd_ready for s in timeline.samples],
        where="post",
        linestyle="--",
        color="#17becf",
        label="slurmd Ready",
    )
    scale.set_ylabel("count", fontsize=8)
    scale.set_xlabel("seconds since start", fontsize=8)
    scale.set_ylim(-0.2, max([timeline.gpus_total, *pending]) + 0.5)
    scale.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
