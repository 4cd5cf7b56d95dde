"""The one way a script from `scripts/` runs on a node over SSH: sent on stdin, arguments quoted."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import pulumi
import pulumi_command as command

from components import bootstrap

DELETE_TIMEOUT = "10m"


def sudo_script_command(arguments: Sequence[pulumi.Input[str]]) -> pulumi.Output[str]:
    return pulumi.Output.all(*arguments).apply(
        lambda args: " ".join(["sudo", "bash", "-s", "--", *(shlex.quote(str(a)) for a in args)])
    )


def run_script(
    name: str,
    script_name: str,
    arguments: Sequence[pulumi.Input[str]],
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    delete_arguments: Sequence[str] | None = None,
    triggers: Sequence[pulumi.Input] = (),
    timeout: str = "60m",
) -> command.remote.Command:
    """Run `scripts/<script_name> ARGUMENTS...` as root on the node behind `connection`.

    With `delete_arguments`, `pulumi destroy` runs the same script with those arguments.
    A changed script or argument re-runs it; `triggers` re-run it when other things change."""
    return command.remote.Command(
        name,
        connection=connection,
        create=sudo_script_command(arguments),
        delete=sudo_script_command(delete_arguments) if delete_arguments is not None else None,
        stdin=bootstrap.script(script_name),
        triggers=list(triggers) or None,
        opts=pulumi.ResourceOptions(
            parent=parent,
            depends_on=list(depends_on),
            # an unreachable node must not hold `pulumi destroy` forever
            custom_timeouts=pulumi.CustomTimeouts(create=timeout, update=timeout, delete=DELETE_TIMEOUT),
        ),
    )
