"""`python -m cli e2e`: the acceptance run on a real AWS account, destroy always.

preflight -> `pulumi up` -> doctor -> every validation scenario -> `pulumi destroy`, through
Pulumi's Automation API (it drives the `pulumi` CLI). Destroy runs after a failed phase and
after Ctrl-C too, unless --keep. One report (report.json and report.txt) records each phase's
duration, when each provider's resources finished during `up`, and every file the validation
runner wrote. On screen, `pulumi up` and `pulumi destroy` print a line per resource done (done of
the plan's total, time since the command began); their whole output goes to pulumi.log. Exit status: 0 every phase passed, 1 one failed, 2 bad settings or preflight
input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cli import as_typed, checklist, typed_command
from core import user_files
from stacks import offline

EXIT_INTERRUPTED = 130
# `pulumi up` progress lines in non-interactive mode: " +  aws:ec2:Vpc testbed-network-vpc created (2s)"
_PROGRESS = re.compile(r"^\s*[+~-]+\s+(?P<type>[a-z0-9-]+:\S+)\s+(?P<name>\S+)\s+(?P<verb>created|updated|deleted)\b")


@dataclass
class Phase:
    name: str
    status: str = "not run"  # passed | failed | interrupted | skipped | not run
    started: str = ""
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Report:
    stack: str
    started: str
    phases: list[Phase] = field(default_factory=list)
    up_by_provider: dict[str, dict[str, float]] = field(default_factory=dict)  # first/last finished, s after start
    artifacts: dict[str, list[str]] = field(default_factory=dict)  # scenario -> files the runner wrote
    summaries: dict[str, str] = field(default_factory=dict)  # scenario -> the runner's summary.txt

    def text(self) -> str:
        lines = [f"e2e of stack {self.stack}, started {self.started}"]
        for p in self.phases:
            lines.append(f"  {p.name:24s} {p.status:12s} {p.seconds:8.1f} s  {p.detail}".rstrip())
        if self.up_by_provider:
            lines.append("pulumi up, by provider (seconds after up started: first and last resource done):")
            lines += [
                f"  {provider:12s} {t['first']:8.1f} {t['last']:8.1f}  ({int(t['count'])} resources)"
                for provider, t in sorted(self.up_by_provider.items(), key=lambda kv: kv[1]["last"])
            ]
        for scenario, files in self.artifacts.items():
            lines.append(f"validation {scenario}: {', '.join(files) or 'no files'}")
            lines += [f"  {line}" for line in self.summaries.get(scenario, "").splitlines()]
        return "\n".join(lines) + "\n"


class ProgressClock:
    """Times `pulumi up` by its progress lines: when each resource finished, by provider."""

    def __init__(self, now: Callable[[], float]):
        self.now, self.start = now, now()
        self.done: dict[str, list[float]] = {}

    def line(self, text: str) -> None:
        m = _PROGRESS.match(text)
        if m and m["verb"] in ("created", "updated"):
            self.done.setdefault(m["type"].split(":", 1)[0], []).append(self.now() - self.start)

    def summary(self) -> dict[str, dict[str, float]]:
        return {p: {"first": min(t), "last": max(t), "count": float(len(t))} for p, t in self.done.items()}


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def counted(resource_type: str) -> bool:
    """What the progress counts: resources, not the stack itself or a provider (`pulumi up` adds
    default providers the program never names)."""
    return resource_type != "pulumi:pulumi:Stack" and not resource_type.startswith("pulumi:providers:")


class ResourceProgress:
    """`pulumi up` / `pulumi destroy` on screen: one line per resource done, with done/total and
    the time since the command began, from the Automation API's engine events (a ResOutputsEvent
    when a resource's step is done, a ResOpFailedEvent when it failed: pulumi/pulumi@v3.272.0
    sdk/python/lib/pulumi/automation/events.py). The total is the plan's count; a destroy after a
    partial `up` ends below it."""

    def __init__(self, command: str, total: int | None, now: Callable[[], float], write: Callable[[str], None]):
        self.command, self.total, self.now, self.write = command, total, now, write
        self.start, self.done = now(), 0

    def on_event(self, event: Any) -> None:
        if event.res_outputs_event is not None:
            step, verb = event.res_outputs_event.metadata, None
        elif event.res_op_failed_event is not None:
            step, verb = event.res_op_failed_event.metadata, "FAILED"
        else:
            return
        if not counted(step.type):
            return
        if verb is None:
            self.done += 1
            verb = {"same": "unchanged"}.get(step.op.value, step.op.value)
        width = len(str(self.total)) if self.total else 1
        count = f"{self.done:>{width}}/{max(self.total, self.done)}" if self.total else str(self.done)
        name = step.urn.rsplit("::", 1)[-1]
        self.write(f"{self.command} [{count}] {_clock(self.now() - self.start):>7}  {verb} {step.type} {name}")


@dataclass
class Tools:
    """The phases' entry points: the real tools, or fakes in tests."""

    preflight: Callable[[list[str]], int]
    doctor: Callable[[list[str]], int]
    validate: Callable[[list[str]], int]
    scenarios: list[str]
    select_stack: Callable[[str], Any]  # -> an Automation API Stack (up, destroy)
    # (scenario, stack) -> why the stack's settings cannot run it (cli.validate.scenario_blocker)
    scenario_blocker: Callable[[str, str], str | None] = lambda scenario, stack: None
    planned_resources: Callable[[str], int | None] = lambda stack: None  # the total the progress shows


def plan_count(stack: str) -> int | None:
    """How many resources `pulumi up` will report done for the stack: the offline plan's."""
    import pulumi

    from core.settings import SettingsError

    try:
        rec = offline.run(offline.stack_config(stack), stack=stack)
    except (SettingsError, pulumi.RunError):  # preflight reports those; without a total it still counts
        return None
    return sum(1 for r in rec.resources if counted(r.type))


def real_tools() -> Tools:
    from pulumi import automation as auto

    from cli import doctor, preflight
    from cli.validate import main as validate_main
    from cli.validate import scenario_blocker
    from validation.scenarios import SCENARIOS

    return Tools(
        preflight=preflight.main,
        doctor=doctor.main,
        validate=validate_main,
        scenarios=list(SCENARIOS),
        select_stack=lambda name: auto.select_stack(stack_name=name, work_dir=str(offline.ROOT)),
        scenario_blocker=scenario_blocker,
        planned_resources=plan_count,
    )


@contextlib.contextmanager
def _stack_kubeconfig() -> Iterator[None]:
    """doctor and validate read the stack this run deployed, not the cluster $KUBECONFIG names
    (without --kubeconfig they would take $KUBECONFIG first)."""
    saved = os.environ.pop("KUBECONFIG", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["KUBECONFIG"] = saved


class Run:
    def __init__(self, stack: str, keep: bool, out: Path, tools: Tools, now: Callable[[], float] = time.monotonic):
        self.stack, self.keep, self.out, self.tools, self.now = stack, keep, out, tools, now
        self.report = Report(stack=stack, started=datetime.now(UTC).isoformat(timespec="seconds"))
        self.log = out / "pulumi.log"
        self.stack_ref: Any = None
        self.planned: int | None = None

    def _phase(self, name: str, action: Callable[[], str | None]) -> bool:
        phase = Phase(name, started=datetime.now(UTC).isoformat(timespec="seconds"))
        self.report.phases.append(phase)
        began = self.now()
        try:
            detail = action()
            phase.status, phase.detail = "passed", detail or ""
        except KeyboardInterrupt:
            phase.status, phase.detail = "interrupted", "Ctrl-C"
            raise
        except Exception as error:  # a phase's failure is a finding of the run, reported as such
            # one line in the report; the whole `pulumi` output is in pulumi.log
            phase.status, phase.detail = "failed", f"{error.__class__.__name__}: {' '.join(str(error).split())[:300]}"
        finally:
            phase.seconds = round(self.now() - began, 1)
        return phase.status == "passed"

    def _tool(self, tool: Callable[[list[str]], int], argv: list[str], codes: list[int] | None = None) -> str:
        with _stack_kubeconfig():
            code = tool(argv)
        if codes is not None:
            codes.append(code)
        if code != 0:
            raise RuntimeError(f"exit status {code}")
        return "exit status 0"

    def _pulumi_output(self, clock: ProgressClock | None) -> Callable[[str], None]:
        def on_output(text: str) -> None:
            with self.log.open("a") as f:
                f.write(text if text.endswith("\n") else text + "\n")
            if clock:
                clock.line(text)

        return on_output

    def _select(self) -> str:
        self.stack_ref = self.tools.select_stack(self.stack)
        return f"stack {self.stack} in {offline.ROOT}"

    def _progress(self, command: str) -> Callable[[Any], None]:
        if self.planned is None:
            self.planned = self.tools.planned_resources(self.stack)
        return ResourceProgress(command, self.planned, self.now, lambda line: print(line, flush=True)).on_event

    def _up(self) -> str:
        clock = ProgressClock(self.now)
        try:
            result = self.stack_ref.up(on_output=self._pulumi_output(clock), on_event=self._progress("pulumi up"))
        finally:
            self.report.up_by_provider = clock.summary()
        changes = getattr(result.summary, "resource_changes", None) or {}
        return ", ".join(f"{k} {v}" for k, v in sorted(changes.items()))

    def _validate(self, scenario: str) -> str:
        out = self.out / f"validate-{scenario}"
        try:
            return self._tool(self.tools.validate, ["--scenario", scenario, "--stack", self.stack, "--out", str(out)])
        finally:
            files = sorted(p.relative_to(self.out).as_posix() for p in out.rglob("*") if p.is_file())
            self.report.artifacts[scenario] = files
            summary = out / "summary.txt"
            if summary.is_file():
                self.report.summaries[scenario] = summary.read_text()

    def _destroy(self) -> str:
        self.stack_ref.destroy(on_output=self._pulumi_output(None), on_event=self._progress("pulumi destroy"))
        return "stack resources deleted"

    def execute(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        interrupted = False
        deployed = False
        ok = True
        try:
            codes: list[int] = []
            if not self._phase("preflight", lambda: self._tool(self.tools.preflight, ["--stack", self.stack], codes)):
                # nothing exists yet, so nothing to destroy
                return checklist.EXIT_BAD_INPUT if codes == [checklist.EXIT_BAD_INPUT] else checklist.EXIT_FAILED
            if not self._phase("select stack", self._select):
                return checklist.EXIT_BAD_INPUT
            deployed = True  # from here on, something may exist
            ok = self._phase("pulumi up", self._up)
            ok = ok and self._phase("doctor", lambda: self._tool(self.tools.doctor, ["--stack", self.stack]))
            healthy = ok
            for scenario in self.tools.scenarios:  # independent experiments: one failing does not stop the rest
                if not healthy:
                    self.report.phases.append(
                        Phase(f"validate {scenario}", "skipped", detail="an earlier phase failed")
                    )
                    continue
                blocker = self.tools.scenario_blocker(scenario, self.stack)
                if blocker:
                    self.report.phases.append(Phase(f"validate {scenario}", "skipped", detail=blocker))
                    continue
                ok = self._phase(f"validate {scenario}", functools.partial(self._validate, scenario)) and ok
        except KeyboardInterrupt:
            interrupted, ok = True, False
        finally:
            if deployed:
                self._teardown()
            self._write()
        if interrupted:
            return EXIT_INTERRUPTED
        destroyed = all(p.status in ("passed", "skipped") for p in self.report.phases if p.name == "pulumi destroy")
        return checklist.EXIT_OK if ok and destroyed else checklist.EXIT_FAILED

    def _teardown(self) -> None:
        if self.keep:
            self.report.phases.append(Phase("pulumi destroy", "skipped", detail="--keep: the stack is left running"))
            return
        for attempt in range(2):
            try:
                self._phase("pulumi destroy", self._destroy)
                return
            except KeyboardInterrupt:  # GPUs bill by the hour: one more try before leaving them
                if attempt == 0:
                    print("e2e: destroy interrupted; running it again (Ctrl-C once more to leave it)", file=sys.stderr)

    def _write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "report.json").write_text(json.dumps(asdict(self.report), indent=2) + "\n")
        text = self.report.text()
        (self.out / "report.txt").write_text(text)
        print(text, end="")
        print(f"wrote {self.out / 'report.json'} and {self.out / 'report.txt'}")


def parser() -> argparse.ArgumentParser:
    p = checklist.OneLineParser(prog=f"{typed_command()} e2e", description=as_typed(__doc__))
    offline.add_stack_arguments(p, overrides=False)  # `pulumi up` reads only Pulumi.<stack>.yaml
    p.add_argument("--keep", action="store_true", help="leave the stack running at the end (and after a failure)")
    p.add_argument("--out", type=Path, help="report folder (default out/e2e-<time>)")
    return p


def main(argv: list[str], tools: Tools | None = None) -> int:
    args = parser().parse_args(argv)
    if args.config:
        # `pulumi up` and `pulumi destroy` read Pulumi.<stack>.yaml only; `pulumi up --config` would
        # write the override into it, so an override for this run alone cannot be honoured.
        print(
            f"--config: not accepted by e2e, which deploys with `pulumi up` from Pulumi.{args.stack}.yaml; set the "
            f"values there (`pulumi config set KEY VALUE --stack {args.stack}`) or use another --stack",
            file=sys.stderr,
        )
        return checklist.EXIT_BAD_INPUT
    out = args.out or Path("out") / f"e2e-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    if problem := user_files.out_dir_problem("--out", out):  # before an hour of deployment, not after
        print(problem, file=sys.stderr)
        return checklist.EXIT_BAD_INPUT
    return Run(args.stack, args.keep, out, tools or real_tools()).execute()
