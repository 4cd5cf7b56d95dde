"""The summary a person reads after a run: the checks, the latencies, every job's times."""

from __future__ import annotations

from validation.checks import Check, Latency, gpu_return_bounds, scale_up_bounds
from validation.timeline import Timeline, job_lives


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def _bounded(value: Latency | None) -> str:
    return "-" if value is None else str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def summary(timeline: Timeline, checks: list[Check]) -> str:
    passed = sum(c.passed for c in checks)
    lines = [
        f"scenario {timeline.scenario}: {passed} of {len(checks)} checks passed "
        f"({len(timeline.samples)} samples every {timeline.interval:.0f} s, started {timeline.started_at})",
        f"ended: {timeline.outcome}" + (f", {timeline.ended}" if timeline.ended else ""),
    ]
    if timeline.waited_for_idle:
        lines.append(f"waited {timeline.waited_for_idle:.0f} s for an idle cluster before t = 0")
    if timeline.errors:
        lines.append(f"cluster errors: {len(timeline.errors)} (retried; the last: {timeline.errors[-1].message})")
    lines += [
        "",
        *_table(["check", "result", "detail"], [[c.name, "PASS" if c.passed else "FAIL", c.detail] for c in checks]),
        "",
        f"scale-up latency (first Slurm job pending -> slurmd Ready): {_bounded(scale_up_bounds(timeline))}",
        f"GPU return latency (last Slurm job done -> slurmd gone):    {_bounded(gpu_return_bounds(timeline))}",
        "(an event first seen in a sample happened after the previous sample started and before this one"
        " ended: hence the bounds)",
        "",
    ]
    gpus = {s.name: s.gpus for s in timeline.submissions}
    rows = [
        [
            life.name,
            life.kind,
            str(gpus[life.name]),
            f"{life.submitted:.0f} s",
            _seconds(life.wait),
            _seconds(life.run),
            life.final_phase or "never seen",
        ]
        for life in job_lives(timeline)
    ]
    lines += _table(["job", "kind", "GPUs", "submitted", "wait", "run", "result"], rows)
    return "\n".join(lines) + "\n"
