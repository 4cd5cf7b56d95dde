"""`python -m cli validate`: replay one reference experiment and check it.

Names, the GPU count and the cooldown come from the stack's settings (`--stack`, `--config`,
as for `plan`); when the deployed stack's outputs can be read they are cross-checked.
Exit status: 0 when every check passed; 1 when one failed or the run was cut short (timeout,
Ctrl-C, too many cluster errors, a cluster that never went idle), with the partial results
written all the same; 2 for bad input, a bad kubeconfig or timeline, or a cluster that does
not answer before the run starts (one line, no traceback).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from cli import as_typed, typed_command
from core import settings, user_files
from core.names import MONITORING_NAMESPACE, PROMETHEUS_PORT, Names
from stacks import offline
from stacks.offline import read_stack_outputs
from validation import probe
from validation.checks import Expectations, describe_checks, evaluate, expectations
from validation.scenarios import SCENARIOS, Scenario, describe, limit_problems, plan
from validation.timeline import DcgmHolding, Timeline

WORK_SECONDS = 2400.0  # heavy-mixed queues for about this long; the default timeout adds the cooldown


class UsageError(Exception):
    """Bad input: reported one line per problem, exit status 2."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line and exit 2 through main(), instead of argparse's usage block.
        raise UsageError(settings.redacted(message))


# --timeout and --interval: decimal seconds within these bounds (no nan, inf or exponent: the
# dry run printed "until done or nan s" and 1e-9 s between samples would poll the API flat out).
TIMEOUT_SECONDS = (60.0, 7 * 24 * 3600.0)
INTERVAL_SECONDS = (1.0, 600.0)
DEFAULT_INTERVAL = 5.0


def seconds_problem(flag: str, text: str | None, bounds: tuple[float, float]) -> str | None:
    """Why `text` is not a number of seconds within `bounds`, or None."""
    lo, hi = bounds
    if text is None or (re.fullmatch(r"[0-9]{1,7}(\.[0-9]{1,3})?", text) and lo <= float(text) <= hi):
        return None
    return f"{flag}: {settings.show(text)} is not allowed; expected seconds from {lo:g} to {hi:g}, e.g. 300 or 2.5"


def parser() -> argparse.ArgumentParser:
    from validation import cluster

    p = _Parser(
        prog=f"{typed_command()} validate",
        description=as_typed(__doc__),
        epilog=f"Longest wait: {cluster.describe_bound()}; a cluster that does not answer the first call ends "
        "the command, exit 2; the run itself lasts at most --timeout.",
    )
    p.add_argument("--scenario", help="one of: " + ", ".join(SCENARIOS))
    offline.add_stack_arguments(p)
    p.add_argument(
        "--kubeconfig", type=Path, help="default: $KUBECONFIG, else `pulumi stack output --show-secrets kubeconfig`"
    )
    p.add_argument(
        "--timeout",
        help=f"seconds, {TIMEOUT_SECONDS[0]:g} to {TIMEOUT_SECONDS[1]:g} (default {WORK_SECONDS:.0f} + kedaCooldownSeconds)",
    )
    p.add_argument(
        "--interval",
        help=f"seconds between samples, {INTERVAL_SECONDS[0]:g} to {INTERVAL_SECONDS[1]:g} (default {DEFAULT_INTERVAL:g})",
    )
    p.add_argument("--out", type=Path, help="output folder (default out/validate-<scenario>-<time>)")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted and checked; no cluster")
    p.add_argument("--from-timeline", type=Path, help="check and draw a saved timeline.json again; no cluster")
    p.add_argument(
        "--dcgm-from-workspace",
        metavar="URL",
        help="with --from-timeline: read the run's GPU owners again from the stack's AMP workspace "
        "(its prometheus_endpoint, e.g. from `aws amp describe-workspace`), after the cluster is gone",
    )
    return p


@dataclass(frozen=True)
class StackFacts:
    names: Names
    source: str  # where the names came from, as the output says
    share_server: str = ""  # the control node's private IP: the NFS server of the shared directory
    region: str = ""  # where the stack's AMP workspace is


def cross_check(names: Names, outputs: dict) -> list[str]:
    """What the deployed stack's outputs contradict in the names derived from the settings."""
    problems = []
    workers = outputs.get("workerPrivateIps")
    if isinstance(workers, list) and len(workers) != names.gpus_total:
        problems.append(
            f"the deployed stack has {len(workers)} GPU workers but the settings give {names.gpus_total}; "
            "pass the deployed stack's own --stack/--config"
        )
    sbatch = outputs.get("sbatchCommand")
    if isinstance(sbatch, str) and f" {names.slurm.controller_pod} " not in sbatch:
        problems.append("the deployed stack's sbatchCommand names another Slurm release than the settings")
    return problems


def stack_facts(
    stack: str, overrides: list[str], read_outputs: Callable[[str], dict | str] | None = None
) -> StackFacts:
    try:
        s = offline.stack_settings(stack, overrides)
    except settings.SettingsError as error:
        raise UsageError(*error.problems) from None
    names = Names.from_settings(s)
    outputs = (read_outputs or read_stack_outputs)(stack)
    if isinstance(outputs, str):
        return StackFacts(
            names, f"settings of stack {stack}; not cross-checked: {outputs}", s.control_private_ip, s.region
        )
    problems = cross_check(names, outputs)
    if problems:
        raise UsageError(*problems)
    return StackFacts(
        names, f"settings of stack {stack}, cross-checked with its deployed outputs", s.control_private_ip, s.region
    )


def needs_every_gpu(scenario: Scenario, exp: Expectations, names: Names) -> str | None:
    """Why the stack cannot run the scenario, if it cannot: the leak probe waits for Slurm to hold
    every GPU, and the queueing check for every GPU to be held, but Kueue's split
    (components/kueue.py) may keep slurmd to HPC's share."""
    if names.slurmd_max_replicas >= names.gpus_total:
        return None
    if not (exp.queueing or any(w.every_gpu for w in scenario.workloads)):
        return None
    return (
        f"--scenario {scenario.name}: needs Slurm to be able to hold every GPU ({names.gpus_total}), "
        f"but this stack lets slurmd hold {names.slurmd_max_replicas} (HPC's share); run it on a stack "
        "with hpcBorrowsAiGpus true and kedaMaxReplicas 0"
    )


def scenario_blocker(scenario_name: str, stack: str) -> str | None:
    """For e2e: why `validate --scenario NAME --stack STACK` would refuse the stack's settings."""
    scenario = SCENARIOS[scenario_name]
    names = stack_facts(stack, [], read_outputs=lambda _: "not read").names
    planned = plan(scenario, "e2e", gpus_total=names.gpus_total)
    blockers = [needs_every_gpu(scenario, expectations(scenario, planned, names.gpus_total), names)]
    return "; ".join(b for b in blockers + limit_problems(scenario, planned, names) if b) or None


def load_kubeconfig(given: Path | None, stack: str) -> dict:
    """--kubeconfig, else $KUBECONFIG, else the stack's kubeconfig output."""
    try:
        config = user_files.read_kubeconfig(given)
    except user_files.UserFileError as error:
        raise UsageError(error.problem) from None
    if config is not None:
        return config
    try:
        out = subprocess.run(
            ["pulumi", "stack", "output", "--show-secrets", "--stack", stack, "kubeconfig"],
            check=True,
            capture_output=True,
            text=True,
            cwd=offline.ROOT,  # the project's folder, wherever the command was run from
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise UsageError(
            f"--kubeconfig and $KUBECONFIG not given and `pulumi stack output kubeconfig` failed ({error}); "
            "pass --kubeconfig PATH"
        ) from None
    try:
        return user_files.parse_yaml(out, typed=True)
    except user_files.UserFileError as error:
        raise UsageError(f"the stack's kubeconfig output is {error.problem}") from None


def write_results(timeline: Timeline, exp: Expectations, out: Path) -> bool:
    from validation.plot import draw
    from validation.report import summary

    out.mkdir(parents=True, exist_ok=True)
    checks = evaluate(timeline, exp)
    timeline.save(out / "timeline.json")
    text = summary(timeline, checks)
    (out / "summary.txt").write_text(text)
    draw(timeline, out / "timeline.png", checks=checks)
    print(text, end="")
    print(f"wrote {out / 'timeline.json'}, {out / 'summary.txt'}, {out / 'timeline.png'}")
    return all(c.passed for c in checks)


def load_timeline(path: Path, scenario: Scenario, names: Names) -> Timeline:
    """A saved timeline, checked against its schema, --scenario and the stack's settings before
    any check runs: a malformed file is bad input, not a failed experiment."""
    from validation.timeline import TimelineError, read_timeline

    shown = settings.show(str(path))
    try:
        timeline = read_timeline(path)
    except TimelineError as error:
        raise UsageError(
            *(
                f"--from-timeline: {shown}{' ' if problem.startswith(('is ', 'cannot ')) else ': '}{problem}"
                for problem in error.problems
            )
        ) from None
    problems = []
    if timeline.scenario != scenario.name:
        problems.append(
            f"--from-timeline: {shown}: recorded under scenario {settings.show(timeline.scenario)}, not "
            f"--scenario {scenario.name}; expected the same scenario"
        )
    if timeline.gpus_total != names.gpus_total:
        problems.append(
            f"--from-timeline: {shown}: recorded with {timeline.gpus_total} GPUs, but the stack's settings give "
            f"{names.gpus_total}; pass the --stack/--config it was recorded with"
        )
    lo, hi = INTERVAL_SECONDS
    if not lo <= timeline.interval <= hi:
        problems.append(
            f"--from-timeline: {shown}: interval {timeline.interval:g} s; expected {lo:g} to {hi:g} s, as --interval"
        )
    if problems:
        raise UsageError(*problems)
    return timeline


def client_for(kubeconfig: dict, names: Names):
    """The live cluster, or UsageError for a kubeconfig the kubernetes client refuses; an exec:
    plugin in it is named on stderr before it runs."""
    from validation.cluster import KubeCluster, KubeconfigError

    prometheus = (MONITORING_NAMESPACE, names.prometheus_service, PROMETHEUS_PORT)
    try:
        return KubeCluster.from_kubeconfig(kubeconfig, names.slurm, prometheus=prometheus)
    except KubeconfigError as error:
        raise UsageError(str(error)) from None


def connect(kubeconfig: dict, names: Names):
    """The live cluster, or UsageError: a bad kubeconfig, an API server that does not answer (each
    call bounded: validation.cluster.describe_bound), or no NodeSet where the testbed puts it."""
    from validation.cluster import ClusterError

    cluster = client_for(kubeconfig, names)
    try:
        cluster.check_reachable()
    except ClusterError as error:
        raise UsageError(f"the cluster does not answer: {error}") from None
    return cluster


def _terminate(signum, frame) -> None:
    from cli.guard import Terminated

    raise Terminated  # SIGTERM ends the run like Ctrl-C: clean up, write what was seen


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as error:
        for problem in error.problems:
            print(f"validate: {problem}", file=sys.stderr)
        return 2


def run_window(timeline: Timeline) -> tuple[float, float]:
    """The run's t = 0 and its last sample's end, in epoch seconds: started_at is when the runner
    began, t = 0 once the cluster was idle (runner.run)."""
    try:
        started = datetime.fromisoformat(timeline.started_at).timestamp()
    except ValueError:
        raise UsageError(f"--from-timeline: started_at {timeline.started_at!r} is not an ISO time") from None
    t0 = started + timeline.waited_for_idle
    return t0, t0 + (timeline.samples[-1].end if timeline.samples else 0.0)


def dcgm_from_workspace(url: str, timeline: Timeline, region: str, stack: str, session=None) -> list[DcgmHolding]:
    """The GPU owners of the saved run, from the workspace; UsageError, one line, for what fails."""
    from botocore.exceptions import BotoCoreError

    from validation import workspace
    from validation.cluster import ClusterError

    if not url.startswith("https://"):
        raise UsageError(
            f"--dcgm-from-workspace: {settings.show(settings.without_url_credentials(url))} is not allowed; "
            "expected the workspace's prometheus_endpoint, https://aps-workspaces.REGION.amazonaws.com/workspaces/ws-.../"
        )
    try:  # a profile that does not exist, a key id without its secret, a config file that does not parse
        if session is None:
            import boto3

            session = boto3.Session()
        credentials = session.get_credentials()
    except BotoCoreError as error:
        raise UsageError(f"--dcgm-from-workspace: aws configuration: {settings.redacted(str(error))}") from None
    if credentials is None:
        raise UsageError("--dcgm-from-workspace: no AWS credentials; set AWS_PROFILE or AWS_ACCESS_KEY_ID")
    try:
        return workspace.dcgm_holdings(url, region, stack, run_window(timeline), timeline.interval, credentials)
    except ClusterError as error:
        raise UsageError(f"--dcgm-from-workspace: {error}") from None


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    problems = []
    if args.dcgm_from_workspace and args.from_timeline is None:
        problems.append("--dcgm-from-workspace: only with --from-timeline (it re-reads a saved run's GPU owners)")
    if args.scenario is None:
        problems.append(f"--scenario is required: one of {', '.join(SCENARIOS)}")
    elif args.scenario not in SCENARIOS:
        problems.append(f"--scenario: {settings.show(args.scenario)} is not one of {', '.join(SCENARIOS)}")
    bad_seconds = False
    for flag, text, bounds in (
        ("--timeout", args.timeout, TIMEOUT_SECONDS),
        ("--interval", args.interval, INTERVAL_SECONDS),
    ):
        if problem := seconds_problem(flag, text, bounds):
            problems.append(problem)
            bad_seconds = True
    if not bad_seconds and args.timeout and args.interval and float(args.interval) >= float(args.timeout):
        problems.append(
            f"--interval: {float(args.interval):g} s is not shorter than --timeout {float(args.timeout):g} s; expected an "
            "interval shorter than the run"
        )
    if args.out is not None and (problem := user_files.out_dir_problem("--out", args.out)):
        problems.append(problem)
    if problems:
        raise UsageError(*problems)
    interval = float(args.interval) if args.interval else DEFAULT_INTERVAL
    scenario = SCENARIOS[args.scenario]
    facts = stack_facts(args.stack, args.config)
    names, slurm = facts.names, facts.names.slurm
    timeout = float(args.timeout) if args.timeout else WORK_SECONDS + names.cooldown_seconds
    now = datetime.now(UTC)
    run_id = "dryrun" if args.dry_run else now.strftime("r%m%d%H%M%S")
    planned = plan(scenario, run_id, gpus_total=names.gpus_total, share_server=facts.share_server)
    exp = expectations(scenario, planned, names.gpus_total)
    blockers = [b for b in [needs_every_gpu(scenario, exp, names)] if b] + limit_problems(scenario, planned, names)
    if blockers:
        raise UsageError(*blockers)
    out = args.out or Path("out") / f"validate-{scenario.name}-{now.strftime('%Y%m%dT%H%M%SZ')}"

    if args.dry_run:
        print(
            f"stack {args.stack}: NodeSet {slurm.namespace}/{slurm.nodeset_resource}, {names.gpus_total} GPUs, "
            f"cooldown {names.cooldown_seconds} s (from {facts.source})"
        )
        print("\n".join(describe(scenario, planned, slurm, names.gpus_total)))
        print(f"records every {interval:g} s until done or {timeout:g} s:")
        print(f"  NodeSet {slurm.namespace}/{slurm.nodeset_resource} replicas; squeue in {slurm.controller_pod};")
        print("  every pod holding nvidia.com/gpu with its node and GPU UUIDs (the device plugin's mounts inside it);")
        print(f"  every process on every GPU and its pod (DaemonSet {probe.NAMESPACE}/{probe.NAME}, removed after);")
        print("  PyTorchJob and Job states")
        print("checks:")
        print("\n".join(f"  {line}" for line in describe_checks(exp)))
        print(f"writes {out}/timeline.json, summary.txt, timeline.png")
        return 0

    if args.from_timeline is not None:
        timeline = load_timeline(args.from_timeline, scenario, names)
        if args.dcgm_from_workspace:
            timeline.dcgm = dcgm_from_workspace(args.dcgm_from_workspace, timeline, facts.region, args.stack)
        return 0 if write_results(timeline, exp, out) else 1

    from validation.cluster import WallClock
    from validation.runner import run

    cluster = connect(load_kubeconfig(args.kubeconfig, args.stack), names)
    signal.signal(signal.SIGTERM, _terminate)
    timeline = run(
        planned,
        cluster,
        WallClock(),
        scenario=scenario.name,
        gpus_total=names.gpus_total,
        interval=interval,
        timeout=timeout,
        started_at=now.isoformat(timespec="seconds"),
    )
    return 0 if write_results(timeline, exp, out) else 1
