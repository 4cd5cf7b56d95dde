"""The SSH key pair the readiness gate and other remote steps use (and you may use)."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_command as command
import pulumi_tls as tls

from core import host_layout

PER_DIAL_TIMEOUT_SECONDS = 30


class SshAccess(pulumi.ComponentResource):
    private_key: pulumi.Output[str]
    key_name: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:SshAccess", name, None, opts)
        key = tls.PrivateKey(f"{name}-key", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self))
        pair = aws.ec2.KeyPair(
            f"{name}-keypair", public_key=key.public_key_openssh, opts=pulumi.ResourceOptions(parent=self)
        )
        self.private_key = pulumi.Output.secret(key.private_key_openssh)
        self.key_name = pair.key_name
        self.register_outputs({"keyName": self.key_name})

    def connection(self, host: pulumi.Input[str], dial_error_limit: int = -1) -> command.remote.ConnectionArgs:
        """-1 (dial until it answers) for steps that wait for a fresh instance, which refuses SSH for
        a while; a bound for steps that also run on delete, when the host may be gone. A step's
        delete dials with the connection stored at create (pulumi/pulumi-command@v1.2.1:
        provider/pkg/provider/remote/commandController.go Delete runs on the stored state)."""
        return command.remote.ConnectionArgs(
            host=host,
            user=host_layout.SSH_USER,
            private_key=self.private_key,
            dial_error_limit=dial_error_limit,
            per_dial_timeout=PER_DIAL_TIMEOUT_SECONDS,
        )
