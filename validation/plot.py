"""The picture of the hand-off: one lane per GPU coloured by owner, with both proofs on it,
and the counts beneath: slurmd replicas, Slurm and Kubernetes work pending.

Each lane shows who held the GPU (allocations, reserved from PodScheduled), the processes the
probe saw on it (dots in the pod allocated the GPU, red crosses anywhere else) and
dcgm-exporter's pod label (a thin line under the lane). Dashed lines mark submissions,
triangles each hand-off from Slurm to Kubernetes; the checks' verdict and the latencies are
written on the figure. Sized to be read at 130 dpi.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from validation.checks import Check, allocations, gpu_return_bounds, scale_up_bounds
from validation.timeline import (
    KUBERNETES,
    SLURMD,
    Timeline,
    gpu_owner,
    gpu_uuids,
    holdings,
    node_of_uuid,
    pod_gpus,
)

if TYPE_CHECKING:
    from matplotlib.artist import Artist

DPI = 130
IDLE_COLOUR = "#eeeeee"
SLURMD_IDLE_COLOUR = "#9ecae1"  # slurmd holds the GPU but runs no Slurm job (cooldown)
RESERVED_COLOUR = "#fee391"  # scheduled, not running yet: pulling its image, init containers
SLURM_COLOURS = ["#08306b", "#4292c6", "#17becf", "#2c7fb8", "#1f4e79", "#6baed6"]
KUBE_COLOURS = ["#2ca02c", "#ff7f0e", "#9467bd", "#d62728", "#8c564b", "#e377c2"]
PASS_COLOUR, FAIL_COLOUR = "#1b7837", "#b2182b"
HATCHES = {"slurmd-idle": "//", "reserved": ".."}


def segments(timeline: Timeline, uuid: str) -> list[tuple[float, float, str, str]]:
    """(start, end, category, label) runs of one GPU's owner; each sample lasts until the next."""
    gpus = pod_gpus(timeline)
    runs: list[list] = []
    samples = timeline.samples
    for i, sample in enumerate(samples):
        end = samples[i + 1].t if i + 1 < len(samples) else sample.t + timeline.interval
        owner = gpu_owner(sample, uuid, gpus) or ("idle", "idle")
        if runs and (runs[-1][2], runs[-1][3]) == owner and runs[-1][1] == sample.t:
            runs[-1][1] = end
        else:
            runs.append([sample.t, end, *owner])
    return [(r[0], r[1], r[2], r[3]) for r in runs]


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
        if category == "reserved":
            mapping[(category, label)] = RESERVED_COLOUR
    return mapping


def handoffs(timeline: Timeline) -> list[tuple[str, float]]:
    """(GPU, time) each GPU went from a slurmd pod to a Kubernetes pod."""
    found = []
    held = holdings(timeline)
    for a, b in pairwise(held):
        if a.uuid == b.uuid and a.holder == SLURMD and b.holder == KUBERNETES:
            found.append((b.uuid, b.start))
    return found


def verdict(
    timeline: Timeline, checks: list[Check] | None, modelled: dict[str, float | None] | None = None
) -> tuple[str, str]:
    """The headline: checks passed (and which failed), latencies with their bounds. A model's
    timeline (the twin's) gives `modelled`, the latencies it knows to the second, and the headline
    states those: the same numbers as its text, not a second reading of its 15 s samples."""
    parts = [f"scenario {timeline.scenario}, {timeline.outcome}"]
    colour = PASS_COLOUR
    if checks is not None:
        failed = [c.name for c in checks if not c.passed]
        parts.append(f"{len(checks) - len(failed)} of {len(checks)} checks passed")
        if failed:
            colour = FAIL_COLOUR
            parts.append("FAILED: " + ", ".join(failed))
    if timeline.outcome != "completed":
        colour = FAIL_COLOUR
    if modelled is not None:
        shown = [
            None if modelled[k] is None else f"{modelled[k]:g} s (modelled)" for k in ("scale_up_s", "gpu_return_s")
        ]
    else:
        shown = [None if b is None else str(b) for b in (scale_up_bounds(timeline), gpu_return_bounds(timeline))]
    latencies = [f"{label} {text}" for label, text in zip(("scale-up", "GPU return"), shown, strict=True) if text]
    return " | ".join(parts) + ("\n" + "; ".join(latencies) if latencies else ""), colour


def draw(
    timeline: Timeline,
    path: Path,
    title: str | None = None,
    checks: list[Check] | None = None,
    modelled: dict[str, float | None] | None = None,
) -> None:
    # matplotlib only here: it takes most of a second to import, and the lanes, hand-offs and
    # verdict above need none of it
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a build machine
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    uuids = gpu_uuids(timeline)
    nodes = node_of_uuid(timeline)
    palette = colours(timeline)
    rows = {u: i for i, u in enumerate(uuids)}
    fig, (lanes, counts) = plt.subplots(
        2,
        1,
        figsize=(12, 2.4 + 0.75 * max(len(uuids), 1) + 2.0),
        sharex=True,
        gridspec_kw={"height_ratios": [max(len(uuids), 1) * 0.75, 2.0]},
    )
    for uuid, row in rows.items():
        for start, end, category, label in segments(timeline, uuid):
            lanes.broken_barh(
                [(start, end - start)],
                (row - 0.35, 0.7),
                color=palette[(category, label)],
                hatch=HATCHES.get(category),
                edgecolor="white",
                linewidth=0.3,
            )
    # dcgm-exporter's record: a thin line under each lane while its pod label named someone.
    for h in timeline.dcgm:
        if h.uuid in rows:
            lanes.plot([h.start, h.end], [rows[h.uuid] + 0.43] * 2, color="#252525", linewidth=2.2)
    # The probe's record: a dot per sighting in the pod allocated that GPU, a red cross otherwise.
    allocated = allocations(timeline)
    good: list[tuple[float, float]] = []
    bad: list[tuple[float, float]] = []
    for sample in timeline.samples:
        for proc in sample.processes:
            if proc.uuid in rows:
                ok = proc.uuid in allocated.get(proc.pod_uid, ())
                (good if ok else bad).append((sample.t, rows[proc.uuid] - 0.43))
    if good:
        lanes.scatter(*zip(*good, strict=True), s=6, color="#252525", marker="o", zorder=3)
    if bad:
        lanes.scatter(*zip(*bad, strict=True), s=60, color=FAIL_COLOUR, marker="x", linewidths=2, zorder=4)
    for uuid, t in handoffs(timeline):
        lanes.scatter([t], [rows[uuid]], s=90, marker="v", color="black", zorder=5)
    # Submissions: a dashed line each, numbered above the lanes; the legend says which is which.
    numbered: dict[float, list[str]] = {}
    for number, sub in enumerate(timeline.submissions, start=1):
        for ax in (lanes, counts):
            ax.axvline(sub.t, color="#636363", linestyle="--", linewidth=0.9, zorder=1)
        numbered.setdefault(sub.t, []).append(str(number))
    for t, numbers in numbered.items():
        lanes.annotate(
            ",".join(numbers),
            (t, -0.75),
            fontsize=9,
            fontweight="bold",
            ha="left",
            va="center",
            xytext=(3, 0),
            textcoords="offset points",
        )
    lanes.set_yticks(range(len(uuids)), [f"{nodes[u]}\n{u[:13]}…" for u in uuids], fontsize=9)
    lanes.set_ylim(len(uuids) - 0.4, -1.0)
    headline, colour = verdict(timeline, checks, modelled)
    fig.suptitle(title or "GPU owners over time", fontsize=12, x=0.01, ha="left")
    lanes.set_title(headline, fontsize=10, color=colour, loc="left")

    legend: list[Artist] = []
    for (category, label), fill in palette.items():
        if category in ("slurmd-idle", "reserved"):
            continue
        text = {"idle": "idle (no pod)", "slurm-job": f"Slurm job {label}", "kubernetes": f"Kubernetes {label}"}[
            category
        ]
        legend.append(Patch(facecolor=fill, label=text))
    if any(c == "slurmd-idle" for c, _ in palette):
        legend.append(Patch(facecolor=SLURMD_IDLE_COLOUR, hatch="//", label="slurmd pod, no Slurm job"))
    if any(c == "reserved" for c, _ in palette):
        legend.append(Patch(facecolor=RESERVED_COLOUR, hatch="..", label="reserved (scheduled, not running)"))
    legend += [
        Line2D([], [], color="#252525", marker="o", linestyle="", markersize=3, label="process in its GPU's pod"),
        Line2D([], [], color=FAIL_COLOUR, marker="x", linestyle="", markersize=7, label="process anywhere else"),
        Line2D([], [], color="#252525", linewidth=2.2, label="dcgm-exporter pod label"),
        Line2D([], [], color="black", marker="v", linestyle="", markersize=8, label="hand-off Slurm -> Kubernetes"),
        Line2D([], [], color="#636363", linestyle="--", label="submission:"),
        *(
            Line2D([], [], linestyle="", label=f"  {number} {sub.name} at {sub.t:.0f} s")
            for number, sub in enumerate(timeline.submissions, start=1)
        ),
    ]
    lanes.legend(handles=legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)

    times = [s.t for s in timeline.samples]
    slurm_pending = [sum(j.phase == "pending" for j in s.slurm_jobs) for s in timeline.samples]
    kube_pending = [sum(p.holder == KUBERNETES and p.phase == "Pending" for p in s.gpu_pods) for s in timeline.samples]
    # Pending first and wide, so the replica lines drawn over it stay readable where they meet.
    counts.step(times, slurm_pending, where="post", linewidth=5, alpha=0.3, color="#d62728", label="Slurm jobs pending")
    counts.step(
        times, kube_pending, where="post", linewidth=5, alpha=0.3, color="#2ca02c", label="Kubernetes GPU pods pending"
    )
    counts.step(
        times, [s.nodeset_replicas for s in timeline.samples], where="post", color="#08306b", label="NodeSet replicas"
    )
    counts.step(
        times,
        [s.slurmd_ready for s in timeline.samples],
        where="post",
        linestyle="--",
        color="#17becf",
        label="slurmd Ready",
    )
    counts.set_ylabel("count", fontsize=9)
    counts.set_xlabel("seconds since start", fontsize=9)
    counts.tick_params(labelsize=9)
    counts.set_ylim(-0.2, max([timeline.gpus_total, *slurm_pending, *kube_pending]) + 0.5)
    counts.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
