"""The control node's SSH host key, from the node to the connection that carries the CA key:
the node's bootstrap publishes it on the console (control-plane.sh, run in the bootstrap sandbox),
read-host-key.sh reads the console through a stand-in for the AWS CLI, and the program pins
what it printed (ssh_access.pinned_host_key). Refusals: no key, two keys, a key of another type."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from components import bootstrap, ssh_access
from core import host_layout
from tests.components.test_bootstrap_idempotent import CONSOLE, HOST_KEY_FILE, Sandbox, control_user_data

# The AWS CLI's stand-in: answers get-console-output with $STUB/console.N on its Nth call (the
# last one from then on), and records its arguments.
STUB_AWS = r"""#!/usr/bin/env bash
echo "aws $*" >>"$STUB/calls"
n=$(grep -c . "$STUB/calls")
file="$STUB/console.$n"
[ -f "$file" ] || file=$(ls "$STUB"/console.* | sort -t. -k2 -n | tail -n 1)
cat "$file"
"""
BOOT_NOISE = "[    0.000000] Linux version 6.8.0-1021-aws\r\nCloud-init v. 25.1 running 'modules:final'\r\n"


def published_console(base: Path) -> tuple[str, str]:
    """A real host public key where cloud-init's ssh module leaves it (OpenSSH's line, with its
    root@host comment), and what the control node's real bootstrap, run in a sandbox, wrote to its
    console: (the public key line, the console)."""
    box = Sandbox(base, control_user_data())
    public = openssh_public(ed25519.Ed25519PrivateKey.generate()) + " root@ip-10-0-1-10\n"
    box.path(HOST_KEY_FILE).write_text(public)
    done = box.run()
    assert done.returncode == 0, done.output
    return public, box.read(CONSOLE)


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Two control nodes' published_console, each with a key of its own, made once for the tests
    that only read them."""
    return {node: published_console(tmp_path_factory.mktemp(node)) for node in ("a", "b")}


def openssh_public(key: ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def read_console(tmp_path: Path, consoles: list[str], timeout: int = 60) -> subprocess.CompletedProcess:
    stub = tmp_path / "stub"
    stub.mkdir()
    for n, text in enumerate(consoles, start=1):
        (stub / f"console.{n}").write_text(text)
    (stub / "calls").write_text("")
    (stub / "aws").write_text(STUB_AWS)
    (stub / "aws").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stub}:{os.environ['PATH']}",
        "STUB": str(stub),
        "INSTANCE_ID": "i-0123456789abcdef0",
        "REGION": "eu-west-1",
        "TIMEOUT_SECONDS": str(timeout),
        "POLL_SECONDS": "0",
        "HOST_KEY_MARKER": host_layout.HOST_KEY_MARKER,
    }
    root = Path(__file__).resolve().parents[2]
    # the program's own command line, from the project directory
    return subprocess.run(ssh_access.HOST_KEY_COMMAND, shell=True, cwd=root, env=env, capture_output=True, text=True)


def test_the_connection_pins_the_key_the_node_published(tmp_path, published):
    public, console = published["a"]
    console = console.replace("\n", "\r\n")  # the serial console's line ends
    # the first reads come before the bootstrap got there: the reader waits for the key
    done = read_console(tmp_path, [BOOT_NOISE, BOOT_NOISE + console + BOOT_NOISE])
    assert done.returncode == 0, done.stderr
    pinned = ssh_access.pinned_host_key(done.stdout)
    assert pinned == " ".join(public.split()[:2])  # the key itself, without the comment
    assert pinned.startswith(ssh_access.HOST_KEY_TYPE + " ")
    calls = (tmp_path / "stub" / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert calls[0] == (
        "aws ec2 get-console-output --region eu-west-1 --instance-id i-0123456789abcdef0 --latest "
        "--query Output --output text"
    )


def test_the_same_key_published_twice_is_one_key(tmp_path, published):
    _, console = published["a"]
    done = read_console(tmp_path, [console + BOOT_NOISE + console])  # a reboot publishes again
    assert done.returncode == 0 and done.stdout.count("ssh-ed25519") == 1


def test_two_different_keys_are_refused(tmp_path, published):
    console = published["a"][1] + published["b"][1]
    done = read_console(tmp_path, [console])
    assert done.returncode != 0 and done.stdout == ""
    assert "published 2 different SSH host keys" in done.stderr


def test_no_key_ends_at_the_deadline_naming_the_console_command(tmp_path):
    done = read_console(tmp_path, [BOOT_NOISE], timeout=0)
    assert done.returncode != 0 and done.stdout == ""
    assert "i-0123456789abcdef0 published no SSH host key" in done.stderr
    assert "aws ec2 get-console-output --region eu-west-1" in done.stderr


def test_a_control_node_without_a_host_key_fails_its_bootstrap_step(tmp_path):
    box = Sandbox(tmp_path, control_user_data())
    box.path(HOST_KEY_FILE).unlink()
    done = box.run()
    assert done.returncode != 0 and "SSH host key to the console" in box.read(host_layout.BOOTSTRAP_STATUS)
    assert "kubeadm init" not in "\n".join(done.calls)


@pytest.mark.parametrize(
    "printed",
    [
        "",
        "not a key",
        "ssh-ed25519 AAAAnotbase64key",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOBb\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOBb",
    ],
)
def test_anything_but_one_ed25519_key_stops_the_deployment(printed):
    with pytest.raises(ValueError, match="host key"):
        ssh_access.pinned_host_key(printed)


def test_a_key_of_another_type_is_refused():
    with pytest.raises(ValueError, match="no single ssh-ed25519 host key"):
        ssh_access.pinned_host_key(openssh_public(ec.generate_private_key(ec.SECP256R1())))


def test_the_control_node_publishes_the_key_before_it_waits_for_the_ca_key():
    """The CA key step dials only once the key is read, and control-plane.sh waits for the CA
    key: the key must be on the console before that wait, and before anything slow."""
    script = bootstrap.script("control-plane.sh")
    published = script.index(f'>"${{ROOT}}{CONSOLE}"')
    assert published < script.index("apt_get") < script.index("wait_until")
