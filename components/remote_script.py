"""The one way a script from `scripts/` runs on the control node over SSH: a typed `RemoteStep`.

The script travels on stdin; its arguments travel by name, as environment values set on the
command line (`sudo env NAME=value ... bash -s`), so sshd needs no `AcceptEnv` and every
script reads its parameters the same way. A secret argument never goes on the command line
(sshd and the provider log it, and `ps` shows it): it travels on stdin as a quoted, readonly,
unexported shell variable ahead of the script. Each step also gets the admin kubeconfig and the
shell library that cloud-init wrote beside the node's bootstrap scripts: cloud-init's
init stage writes files before sshd starts (canonical/cloud-init:systemd/cloud-init.service.tmpl,
`Before=sshd.service`), so the library is there when the first step connects.
"""

from __future__ import annotations

import functools
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_command as command

from components import bootstrap
from core import host_layout

DELETE_TIMEOUT = "10m"
STEP_NAME = "TESTBED_STEP"  # which script a command runs: `render` and the tests read it back


@dataclass(frozen=True)
class RemoteStep:
    """One script from components/scripts, run as root on the control node."""

    script: str
    args: Mapping[str, pulumi.Input[str]]  # the script's parameters, by name
    delete_args: Mapping[str, str] | None = None  # `pulumi destroy` runs the script again with these
    triggers: Sequence[pulumi.Input] = field(default_factory=tuple)  # re-run it when these change
    timeout_seconds: int = 60 * 60  # the step's own limit; scripts keep their deadlines inside it
    secrets: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # by name, on stdin

    def stdin(self) -> pulumi.Input[str]:
        """The script, preceded by its secrets (see `stdin_text`)."""
        if not self.secrets:
            return bootstrap.script(self.script)
        names = sorted(self.secrets)
        return pulumi.Output.secret(
            pulumi.Output.all(*(self.secrets[n] for n in names)).apply(
                lambda values: stdin_text(self.script, dict(zip(names, values, strict=True)))
            )
        )

    def environment(self, args: Mapping[str, pulumi.Input[str]]) -> dict[str, pulumi.Input[str]]:
        return {
            STEP_NAME: self.script,
            "KUBECONFIG": host_layout.ADMIN_KUBECONFIG,
            "TESTBED_LIB": f"{bootstrap.NODE_SCRIPT_DIR}/{bootstrap.LIBRARY}",
            **args,
        }


def command_line(environment: Mapping[str, pulumi.Input[str]]) -> pulumi.Input[str]:
    """`sudo env NAME=value ... bash -s`, every value quoted: text when every value is, else an Output
    (the engine gets the same string either way; text spares a mock run two Output chains a step)."""
    names = sorted(environment)

    def line(values: Sequence[str]) -> str:
        words = (shlex.quote(f"{n}={v}") for n, v in zip(names, values, strict=True))
        return " ".join(["sudo", "env", *words, "bash", "-s"])

    values = [environment[n] for n in names]
    texts = [v for v in values if isinstance(v, str)]
    if len(texts) == len(values):
        return line(texts)
    return pulumi.Output.all(*values).apply(line)


def parse_command_line(line: str) -> dict[str, str]:
    """The arguments of a command made by `command_line`, by name (for `render` and the tests)."""
    return dict(_arguments(line))


@functools.lru_cache(maxsize=1024)
def _arguments(line: str) -> tuple[tuple[str, str], ...]:
    # split once per line (shlex is slow): render and the tests read the same steps' lines many times
    words = shlex.split(line)
    if words[:2] != ["sudo", "env"] or words[-2:] != ["bash", "-s"]:
        raise ValueError(f"not a remote step command line: {line[:80]!r}")
    return tuple((name, value) for name, value in (word.split("=", 1) for word in words[2:-2]))


def stdin_text(script: str, secrets: Mapping[str, str]) -> str:
    """One `readonly NAME='value'` line per secret (a shell variable, not exported to the
    commands the script runs), then the script."""
    prelude = "".join(f"readonly {n}={shlex.quote(v)}\n" for n, v in sorted(secrets.items()))
    return prelude + bootstrap.script(script)


def script_of(stdin: str) -> str:
    """The script a step's stdin carries, without its secrets (for `render`)."""
    lines = stdin.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("#!/"))
    return "".join(lines[start:])


def run(
    name: str,
    step: RemoteStep,
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> command.remote.Command:
    """A changed script or argument re-runs the step; so do its triggers."""
    if step.delete_args is not None and connection.dial_error_limit == -1:
        raise ValueError(f"{name}: a step that runs on delete must dial with a bounded dial_error_limit")
    timeout = f"{-(-step.timeout_seconds // 60)}m"
    return command.remote.Command(
        name,
        connection=connection,
        create=command_line(step.environment(step.args)),
        delete=command_line(step.environment(step.delete_args)) if step.delete_args is not None else None,
        stdin=step.stdin(),
        triggers=list(step.triggers) or None,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            # an unreachable node must not hold `pulumi destroy` forever
            custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout, delete=DELETE_TIMEOUT),
        ),
    )
