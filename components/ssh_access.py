"""The SSH key pair the readiness gate and other remote steps use (and you may use), and the
control node's host key those steps pin.

pulumi-command accepts any host key when a connection names none (pulumi/pulumi-command@v1.2.1
provider/pkg/provider/remote/connection.go SSHConfig: InsecureIgnoreHostKey), and the CA key
travels over these connections. The node publishes its host key on its serial console at the
start of its role's bootstrap (control-plane.sh); a local command reads it through the
EC2 API (read-host-key.sh), an authenticated channel that no one on the network path to the node
can alter, and every connection carries it: the provider then accepts only that key
(ssh.FixedHostKey, and only its algorithm). No private key goes into user-data: the node keeps
the host key cloud-init generated."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_command as command
import pulumi_tls as tls

from core import host_layout

PER_DIAL_TIMEOUT_SECONDS = 30
HOST_KEY_SCRIPT = "read-host-key.sh"
# boot, cloud-init's first stages, node-common.sh (packages), then control-plane.sh's first step
HOST_KEY_TIMEOUT_SECONDS = 20 * 60
HOST_KEY_TYPE = "ssh-ed25519"
HOST_KEY_COMMAND = f"bash components/scripts/{HOST_KEY_SCRIPT}"  # from the project directory


def pinned_host_key(published: str) -> str:
    """The key read-host-key.sh printed, as a connection's host_key: one OpenSSH ed25519 public
    key, which must parse. Anything else stops `pulumi up` here rather than at the first dial."""
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    lines = published.strip().splitlines()
    words = lines[0].split() if len(lines) == 1 else []
    if len(words) != 2 or words[0] != HOST_KEY_TYPE:
        raise ValueError(f"the control node published no single {HOST_KEY_TYPE} host key: {published[:120]!r}")
    try:
        load_ssh_public_key(" ".join(words).encode())
    except ValueError as error:
        raise ValueError(f"the control node's published host key does not parse: {error}") from None
    return " ".join(words)


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

    def host_key(self, name: str, instance: aws.ec2.Instance, region: str) -> pulumi.Output[str]:
        """The host key `instance` published on its console, read once per instance (a
        replacement is read again: its id is in the command's environment). The command runs
        from the project directory, where Pulumi starts the program and its plugins."""
        reader = command.local.Command(
            f"{name}-host-key",
            create=HOST_KEY_COMMAND,
            environment={
                "INSTANCE_ID": instance.id,
                "REGION": region,
                "TIMEOUT_SECONDS": str(HOST_KEY_TIMEOUT_SECONDS),
                "HOST_KEY_MARKER": host_layout.HOST_KEY_MARKER,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[instance],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{HOST_KEY_TIMEOUT_SECONDS // 60 + 5}m"),
            ),
        )
        return reader.stdout.apply(pinned_host_key)

    def connection(
        self, host: pulumi.Input[str], host_key: pulumi.Input[str], dial_error_limit: int = -1
    ) -> command.remote.ConnectionArgs:
        """-1 (dial until it answers) for steps that wait for a fresh instance, which refuses SSH for
        a while; a bound for steps that also run on delete, when the host may be gone. A step's
        delete dials with the connection stored at create (pulumi/pulumi-command@v1.2.1:
        provider/pkg/provider/remote/commandController.go Delete runs on the stored state)."""
        return command.remote.ConnectionArgs(
            host=host,
            user=host_layout.SSH_USER,
            private_key=self.private_key,
            host_key=host_key,
            dial_error_limit=dial_error_limit,
            per_dial_timeout=PER_DIAL_TIMEOUT_SECONDS,
        )
