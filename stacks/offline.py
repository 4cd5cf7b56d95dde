"""Run the real program under Pulumi's mock engine: no CLI, credentials, cloud or network.

`plan`, `render` and the test suite all go through `run()`, so what they inspect is what
`pulumi up` would register. Every ID, IP, AMI and key the mock returns is a placeholder:
IPs come from the documentation ranges (RFC 5737) and IDs end in `-placeholder`.

Built on Pulumi's public mocks API (pulumi 3.272.0, sdk/python/lib/pulumi/runtime/mocks.py):
`reset_options`, `set_all_config`, `set_mocks` and the `test` runner; `Mocks.new_resource` and
`Mocks.call` answer every registration and invoke. `MockResourceArgs` carries a resource's type,
name, inputs and provider only, so one seam is not public (see `RecordingMonitor`): where a
resource sits and how it is managed (URN, parent, dependencies, custom timeouts, lifecycle
options), which plan --json shows and the tests check, is read from the registration request.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime.mocks import MockMonitor

from core import settings as settings_mod
from core import user_files

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT  # where Pulumi.<stack>.yaml files are read (tests point it elsewhere)
PLACEHOLDER_PUBLIC_IP = "198.51.100.10"  # RFC 5737 documentation range: never a real host
PLACEHOLDER_ACCOUNT = "123456789012"  # the account id AWS documentation uses
SECRET_TEXT = "[secret]"
# How a secret travels in every property map, mock inputs included: {_SECRET_SIG: _SECRET_VALUE,
# "value": ...}. Wire constants every SDK shares (pulumi/pulumi sdk/go/common/resource/sig/sig.go,
# Key and Secret); the Python SDK keeps its copies private (runtime/rpc.py, _special_sig_key).
_SECRET_SIG = "4dabf18193072939515e22adb298388d"
_SECRET_VALUE = "1b47061264138c4ac30d75fd1eb44270"


@dataclass
class RecordedResource:
    urn: str
    type: str
    name: str
    parent: str
    depends_on: list[str]
    inputs: dict[str, Any]
    outputs: dict[str, Any] = field(default_factory=dict)
    provider: str = ""  # "<provider urn>::<id>" when an explicit provider is used
    custom_timeouts: dict[str, str] = field(default_factory=dict)  # create/update/delete, when set
    # the lifecycle options the engine receives, each only where set (plan --json shows them)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Recording:
    settings: settings_mod.Settings
    resources: list[RecordedResource]
    outputs: dict[str, Any]
    secret_outputs: set[str]
    invokes: list[tuple[str, str]]
    invoke_args: dict[str, dict[str, Any]] = field(default_factory=dict)  # token -> first call's arguments

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]

    def named(self, name: str) -> RecordedResource:
        found = [r for r in self.resources if r.name == name]
        if len(found) != 1:
            raise KeyError(f"{len(found)} resources named {name}")
        return found[0]


# ---------------------------------------------------------------------- values


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(_SECRET_SIG) == _SECRET_VALUE


def _walk(value: Any, on_secret: Callable[[dict], Any], on_leaf: Callable[[Any], Any] = lambda v: v) -> Any:
    """Rebuild `value`, handing each secret wrapper to `on_secret` and each plain leaf to `on_leaf`."""
    if is_secret(value):
        return on_secret(value)
    if isinstance(value, dict):
        return {k: _walk(v, on_secret, on_leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, on_secret, on_leaf) for v in value]
    return on_leaf(value)


def whole_numbers(value: Any) -> Any:
    """The engine carries every number as a double; providers write whole ones as integers
    (401, not 401.0), and so does render."""
    return _walk(
        value,
        on_secret=lambda s: {**s, "value": whole_numbers(s["value"])},
        on_leaf=lambda v: int(v) if isinstance(v, float) and v.is_integer() else v,
    )


def reveal(value: Any) -> Any:
    """The value as deployed, secrets unwrapped (render writes exactly what is deployed)."""
    return _walk(value, on_secret=lambda s: reveal(s["value"]))


def redact(value: Any) -> Any:
    """The value with every secret replaced by "[secret]" (plan output)."""
    return _walk(value, on_secret=lambda s: SECRET_TEXT)


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def placeholder_key_pem(name: str) -> tuple[str, str, str]:
    """A real, deterministic EC key per resource name: (private PEM, public PEM, OpenSSH).

    Real keys let tests recompute derived values (the kubeadm discovery hash) from the
    mock's output; determinism keeps two renders byte-identical."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.derive_private_key(int(_digest("key", name), 16) % (2**255) + 1, ec.SECP256R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key()
    public_pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    openssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return private_pem, public_pem, openssh


def placeholder_host_key(name: str) -> str:
    """A real, deterministic SSH ed25519 public key, as a node publishes its host key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(_digest("host-key", name)))
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def placeholder_cert_pem(name: str) -> str:
    body = _digest("cert", name) * 4
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"


# ---------------------------------------------------------------------- mocks


class TestbedMocks(pulumi.runtime.Mocks):
    """Returns inputs plus the computed outputs the program reads, as placeholders, and
    records every invoke as (token, provider reference)."""

    def __init__(self, deployed_outputs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.invokes: list[tuple[str, str]] = []
        # the stack outputs of the last deployment, as the stack's reference to itself reads
        # them; none by default (a first deployment)
        self.deployed_outputs = deployed_outputs or {}
        self.invoke_args: dict[str, dict[str, Any]] = {}  # what preflight repeats against AWS
        self.region = "us-east-1"  # the stack's region (run() sets it): the placeholder ARNs carry it
        # the registration each thread is answering: the monitor registers from an executor's
        # threads, several at once, and records what the mock saw with where the resource sits
        self.answering = threading.local()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.answering.args = args
        outputs = dict(args.inputs)
        typ, name = args.typ, args.name
        if typ == "tls:index/privateKey:PrivateKey":
            private_pem, public_pem, openssh = placeholder_key_pem(name)
            outputs.update(
                privateKeyPem=private_pem,
                privateKeyOpenssh=private_pem,
                publicKeyPem=public_pem,
                publicKeyOpenssh=openssh + "\n",
            )
        elif typ in ("tls:index/selfSignedCert:SelfSignedCert", "tls:index/locallySignedCert:LocallySignedCert"):
            outputs["certPem"] = placeholder_cert_pem(name)
        elif typ == "tls:index/certRequest:CertRequest":
            outputs["certRequestPem"] = "placeholder certificate request for " + name
        elif typ in ("random:index/randomString:RandomString", "random:index/randomPassword:RandomPassword"):
            alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
            digest = _digest("random", name)
            outputs["result"] = "".join(
                alphabet[int(digest[i : i + 2], 16) % len(alphabet)]
                for i in range(0, 2 * int(args.inputs.get("length", 16)), 2)
            )
        elif typ == "aws:ec2/eip:Eip":
            outputs["publicIp"] = PLACEHOLDER_PUBLIC_IP
        elif typ == "aws:amp/workspace:Workspace":
            workspace = f"ws-{name}-placeholder"
            outputs["arn"] = f"arn:aws:aps:{self.region}:{PLACEHOLDER_ACCOUNT}:workspace/{workspace}"
            outputs["prometheusEndpoint"] = (
                f"https://aps-workspaces.{self.region}.amazonaws.com/workspaces/{workspace}/"
            )
        elif typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            outputs.setdefault("name", f"{name}-placeholder")  # the engine's auto-name, in a real run
            kind = "role" if typ.endswith("Role") else "instance-profile"
            outputs["arn"] = f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:{kind}/{outputs['name']}"
        elif typ == "command:remote:Command":
            outputs["stdout"] = ""
        elif typ == "command:local:Command" and name.endswith("-host-key"):
            outputs["stdout"] = placeholder_host_key(name) + "\n"  # as read-host-key.sh prints it
        elif typ == "pulumi:pulumi:StackReference":
            outputs.update(outputs=self.deployed_outputs, secretOutputNames=[])
        return f"{name}-placeholder", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.invokes.append((args.token, args.provider or ""))
        self.invoke_args.setdefault(args.token, dict(args.args))
        if args.token == "aws:ec2/getAmi:getAmi":
            return {
                "id": "ami-0placeholder000000",
                "imageId": "ami-0placeholder000000",
                "name": "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-placeholder",
            }
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {
                "id": PLACEHOLDER_ACCOUNT,
                "accountId": PLACEHOLDER_ACCOUNT,
                "arn": f"arn:aws:iam::{PLACEHOLDER_ACCOUNT}:user/placeholder",
                "userId": "AIDAPLACEHOLDER",
            }
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            # Offline, nobody knows which zones offer the type: every zone the settings accept
            # does, so the plan refuses no zone on made-up data; preflight asks AWS (plan_header).
            region = "us-east-1"
            for f in args.args.get("filters", []):
                if f.get("name") == "location":
                    region = f["values"][0][:-1]
            letters = settings_mod.REGION_ZONE_LETTERS.get(region, settings_mod.OTHER_REGION_ZONE_LETTERS)
            zones = [f"{region}{z}" for z in letters]
            return {
                "id": "placeholder",
                "locations": zones,
                "instanceTypes": ["placeholder"] * len(zones),
                "locationTypes": ["availability-zone"] * len(zones),
            }
        return {}


class RecordingMonitor(MockMonitor):
    """Records every registration: what it is, from the public `Mocks.new_resource` it answers
    (type, name, inputs, provider; the outputs it returned), with where it sits and how it is
    managed, from the request itself.

    The one use of Pulumi beyond its public mocks API, kept here: `MockResourceArgs` (pulumi
    3.272.0, runtime/mocks.py) carries no URN, parent, dependencies, custom timeouts or resource
    options, and plan --json and the tests need each. They are read from the RegisterResource
    and ReadResource requests (pulumi/proto resource.proto, the engine's own view of the
    program, implicit dependencies from inputs included) by this monitor, which `set_mocks`
    takes as its `monitor` argument; a resource transform cannot stand in: under mocks nothing
    runs transforms (MockMonitor.RegisterStackTransform only records them), and a transform
    sees only the explicit `depends_on`, not the engine's dependencies."""

    mocks: TestbedMocks

    def __init__(self, mocks: TestbedMocks):
        super().__init__(mocks)
        self.recorded: list[RecordedResource] = []

    def _record(self, request, urn: str, **placement) -> None:
        answered = self.mocks.answering.args  # what `new_resource` just answered, on this thread
        self.recorded.append(
            RecordedResource(
                urn=urn,
                type=answered.typ,
                name=answered.name,
                parent=request.parent,
                depends_on=sorted(set(request.dependencies)),
                inputs=whole_numbers(answered.inputs),
                outputs=self.resources[urn].state,
                provider=answered.provider or "",
                **placement,
            )
        )

    def RegisterResource(self, request):
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":  # the root: no mock answers it
            timeouts = {k: v for k in ("create", "update", "delete") if (v := getattr(request.customTimeouts, k))}
            self._record(request, response.urn, custom_timeouts=timeouts, options=lifecycle_options(request))
        return response

    def ReadResource(self, request):
        """A read resource (the stack's reference to itself) is recorded too: others depend on it."""
        response = super().ReadResource(request)
        self._record(request, response.urn)
        return response


def lifecycle_options(request) -> dict[str, Any]:
    """deletedWith, ignoreChanges, replaceOnChanges, replaceWith, replacementTrigger,
    deleteBeforeReplace, protect and retainOnDelete as the RegisterResource request carries them, each only where set."""
    trigger = request.replacement_trigger
    options = {
        "replacementTrigger": whole_numbers(json_format.MessageToDict(trigger))
        if request.HasField("replacement_trigger")
        else None,
        "deletedWith": request.deletedWith,
        "ignoreChanges": sorted(request.ignoreChanges),
        "replaceOnChanges": sorted(request.replaceOnChanges),
        "replaceWith": sorted(request.replace_with),
        "deleteBeforeReplace": request.deleteBeforeReplace,
        "protect": request.protect,
        "retainOnDelete": request.retainOnDelete,
    }
    return {k: v for k, v in options.items() if v}


# ---------------------------------------------------------------------- running


def read_stack_outputs(stack: str, show_secrets: bool = False) -> dict | str:
    """A deployed stack's outputs (`pulumi stack output --json`), or why they cannot be read."""
    command = ["pulumi", "stack", "output", "--json", "--stack", stack]
    try:
        done = subprocess.run(
            command + (["--show-secrets"] if show_secrets else []),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,  # the project's folder, wherever the command was run from
        )
    except FileNotFoundError:
        return "the pulumi CLI is not on PATH"
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"pulumi stack output failed ({error.__class__.__name__})"
    if done.returncode != 0:
        return f"stack {stack} has no outputs (not deployed, or not this backend)"
    try:
        return json.loads(done.stdout)
    except ValueError:
        return "pulumi stack output printed no JSON"


def add_stack_arguments(parser: argparse.ArgumentParser, overrides: bool = True) -> None:
    """`--stack` and `--config`, the same for every command that reads a stack's settings; a
    command that cannot honour overrides (`overrides=False`) still parses `--config`, to refuse
    it in one line, but does not list it in its help."""
    parser.add_argument("--stack", default="dev", help="reads Pulumi.<stack>.yaml (default: dev)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting (with or without the project prefix); repeatable" if overrides else argparse.SUPPRESS,
    )


STACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # Pulumi's stack name characters; no path separators


# The Pulumi CLI hands the program its stack's configuration in PULUMI_CONFIG, in place of any
# the user's environment holds; the SDK reads it there (pulumi 3.272.0, runtime/config.py
# get_config_env). Set by hand for a tool here, it would change what plan, cost and preflight
# see and not what `pulumi up` builds: refused, and the offline engine sets it as Pulumi does.
PULUMI_CONFIG = "PULUMI_CONFIG"


def environment_problem(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why the environment's PULUMI_CONFIG is refused, if it is set (its text is not parsed or echoed)."""
    if PULUMI_CONFIG not in environ:
        return None
    return (
        f"${PULUMI_CONFIG}: set in the environment ({len(environ[PULUMI_CONFIG])} characters, not read): "
        "`pulumi up` gives the program its stack's config there in its place, so plan, cost and preflight "
        "would show what it does not build; expected it unset, and settings in Pulumi.<stack>.yaml or "
        "--config KEY=VALUE"
    )


def stack_config(stack: str = "dev", overrides: list[str] | None = None, root: Path | None = None) -> dict[str, Any]:
    """Namespaced config from Pulumi.<stack>.yaml plus KEY=VALUE overrides (prefix optional)."""
    return stack_config_sourced(stack, overrides, root)[0]


def stack_config_sourced(
    stack: str = "dev", overrides: list[str] | None = None, root: Path | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Namespaced config from Pulumi.<stack>.yaml plus KEY=VALUE overrides (prefix optional), and
    where each key came from (the stack file's name, or --config).

    Scalars are read as their text, as Pulumi passes them to the program, so `workerCount: 2`
    and `workerCount: "2"` are the same; an encrypted (secure) value stays a mapping, which
    `settings.load` refuses without echoing it. Defaults are not copied from Pulumi.yaml:
    `settings.load` applies the same defaults. Every problem at once: a stack file that cannot
    be read does not hide the --config ones."""
    problems: list[str] = []
    if not STACK_NAME.fullmatch(stack) or stack.strip(".") == "":
        raise settings_mod.SettingsError(
            [f"--stack: {settings_mod.show(stack)} is not allowed; expected a stack name (letters, digits, _ . -)"]
        )
    root = root or STACKS_DIR
    stack_file = root / f"Pulumi.{stack}.yaml"
    section: dict = {}
    if not stack_file.is_file():
        present = sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in root.glob("Pulumi.*.yaml"))
        problems.append(
            f"--stack: {settings_mod.show(stack)} has no stack file "
            f"{'Pulumi.<stack>.yaml' if settings_mod.secret_kind(stack) else stack_file.name} in {root}; "
            f"stacks here: {', '.join(present) or 'none'}"
        )
    else:
        try:
            # every scalar as its text, as Pulumi passes it to the program
            document = user_files.read_yaml(stack_file, "a stack file", typed=False) or {}
        except user_files.UserFileError as error:
            problems.append(f"{stack_file.name}: {error.problem}")
            document = {}
        found = document.get("config") or {} if isinstance(document, dict) else None
        if isinstance(found, dict):
            section = found
        else:
            problems.append(f"{stack_file.name}: config: is not allowed; expected a mapping of keys")
    config: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, value in section.items():
        encrypted = isinstance(value, dict) and "secure" in value
        config[key] = value if isinstance(value, str) or encrypted else json.dumps(value)
        sources[key] = stack_file.name
    prefix = settings_mod.PROJECT + ":"
    overridden: set[str] = set()
    for item in overrides or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(
                f"--config: {settings_mod.show(item)} is not allowed; expected KEY=VALUE, e.g. workerCount=2"
            )
            continue
        full = key if ":" in key else prefix + key
        if full in overridden:  # the last one would win silently
            problems.append(f"--config: {settings_mod.key_shown(key)} is given more than once; expected each key once")
        overridden.add(full)
        config[full] = value
        sources[full] = "--config"
    if problems:
        raise UnreadableStack(problems, config, sources)
    return config, sources


class UnreadableStack(settings_mod.SettingsError):
    """The stack's config could not be read whole; `config` holds what could (the --config items)."""

    def __init__(self, problems: list[str], config: dict[str, Any], sources: dict[str, str]):
        super().__init__(problems)
        self.config, self.sources = config, sources


def _override_problems(error: UnreadableStack) -> list[str]:
    """What is wrong with the --config values themselves, when the stack file cannot be read: the
    settings' own rules on those keys (not the missing ones, which the file may hold)."""
    given = [k for k, source in error.sources.items() if source == "--config"]
    if not given:
        return []
    try:
        settings_mod.load(error.config, offline=True)
    except settings_mod.SettingsError as found:
        return [p for p in sourced(found.problems, error.sources) if p.endswith("(from --config)")]
    return []


def sourced(problems: list[str], sources: Mapping[str, str]) -> list[str]:
    """Each settings problem with where its value came from: `workerCount: "0" is not allowed;
    expected ... (from --config)`. A problem names its key first, with or without the project."""
    prefix = settings_mod.PROJECT + ":"
    out = []
    for problem in problems:
        head = problem.split(": ", 1)[0]  # the key the line names: a setting, or a whole foreign key
        source = sources.get(head) or sources.get(prefix + head)
        out.append(f"{problem} (from {source})" if source else problem)
    return out


def load_stack(
    stack: str = "dev", overrides: list[str] | None = None, *, deployment: bool = False, root: Path | None = None
) -> tuple[dict[str, Any], settings_mod.Settings]:
    """The stack's config and its settings as the program reads them, without Pulumi (SettingsError,
    every problem at once, each saying where its value came from). `deployment` refuses what only a
    deployment refuses (the documentation adminCidr), as preflight must."""
    problems = [p for p in [environment_problem()] if p]
    try:
        config, sources = stack_config_sourced(stack, overrides, root)
    except UnreadableStack as error:
        raise settings_mod.SettingsError(problems + error.problems + _override_problems(error)) from None
    except settings_mod.SettingsError as error:
        raise settings_mod.SettingsError(problems + error.problems) from None
    try:
        s = settings_mod.load(config, stack=stack, offline=not deployment)
    except settings_mod.SettingsError as error:
        raise settings_mod.SettingsError(problems + sourced(error.problems, sources)) from None
    if problems:
        raise settings_mod.SettingsError(problems)
    return config, s


def stack_settings(stack: str = "dev", overrides: list[str] | None = None) -> settings_mod.Settings:
    """The stack's settings as the program reads them, without Pulumi: `load_stack`'s settings."""
    return load_stack(stack, overrides)[1]


ORGANIZATION = "organization"  # what a local (or self-managed) backend calls every stack's organization


def run_under_mocks(
    program: Callable[[], Any], config: dict[str, str], stack: str = "dev", monitor: RecordingMonitor | None = None
) -> RecordingMonitor:
    """Run `program` as `pulumi up` runs one, under the monitor's mocks and `config`, from a fresh
    runtime (no root stack, settings or config left from an earlier run); the monitor holds what
    it registered. What the program raises is raised here, once every registration is done."""
    monitor = monitor or RecordingMonitor(TestbedMocks())
    asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.reset_options(project=settings_mod.PROJECT, stack=stack, preview=False, organization=ORGANIZATION)
    pulumi.runtime.set_all_config(config)
    pulumi.runtime.set_mocks(
        monitor.mocks,
        project=settings_mod.PROJECT,
        stack=stack,
        preview=False,
        monitor=monitor,
        organization=ORGANIZATION,
    )
    before = os.environ.get(PULUMI_CONFIG)
    os.environ[PULUMI_CONFIG] = json.dumps(config)  # as the Pulumi CLI gives it: settings_from_pulumi reads it
    try:
        # `test` runs the program and awaits what it returns, then every registration it started
        pulumi.runtime.test(program)()
    finally:
        if before is None:
            del os.environ[PULUMI_CONFIG]
        else:
            os.environ[PULUMI_CONFIG] = before
    return monitor


def run(config: dict[str, str], stack: str = "dev", mocks: TestbedMocks | None = None) -> Recording:
    """Validate settings, then run the whole program under mocks and resolve its outputs."""
    from stacks import testbed

    settings = settings_mod.load(config, stack=stack, offline=True)  # raises SettingsError before any resource
    mocks = mocks or TestbedMocks()
    mocks.region = settings.region
    values: dict[str, Any] = {}
    secret_names: set[str] = set()
    names: list[str] = []  # the outputs in the program's order

    def program() -> pulumi.Output:
        outputs = testbed.build(testbed.settings_from_pulumi(offline=True))
        names.extend(outputs)

        def resolve(name: str, value: pulumi.Input) -> pulumi.Output:
            output = pulumi.Output.from_input(value)

            async def note_secret() -> None:
                if await output.is_secret():
                    secret_names.add(name)

            return pulumi.Output.all(output.apply(lambda v: values.__setitem__(name, v)), note_secret())

        return pulumi.Output.all(*(resolve(name, value) for name, value in outputs.items()))

    monitor = run_under_mocks(program, config, stack, RecordingMonitor(mocks))
    return Recording(
        settings=settings,
        resources=monitor.recorded,
        outputs={name: values[name] for name in names},
        secret_outputs=secret_names,
        invokes=mocks.invokes,
        invoke_args=mocks.invoke_args,
    )
