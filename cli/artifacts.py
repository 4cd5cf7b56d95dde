"""What `render` writes and `plan` prints, derived from a recorded mock run."""

from __future__ import annotations

import ipaddress
import json
import shutil
import tempfile
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from components import (
    ai_run_limit,
    bootstrap,
    fair_share,
    fair_share_controller,
    keda,
    kueue,
    remote_script,
    runnable_exporter,
    slurm_config,
    slurmd_scaling,
)
from core import trusted_yaml, user_files
from core.names import (
    AMP_WORKSPACE_TYPE_TOKEN,
    DEFAULT_PARTITION,
    FAIR_SHARE_CONTROLLER,
    FAIR_SHARE_NAMESPACE,
    IAM_ROLE_TYPE_TOKEN,
    INSTANCE_TYPE_TOKEN,
    REMOTE_COMMAND_TYPE_TOKEN,
    SLURM_CHART,
    Names,
    SlurmNames,
)
from core.settings import DOCUMENTATION_NETWORKS, show
from stacks import pricing
from stacks.offline import RecordedResource, Recording, redact, reveal
from stacks.pricing import CostEstimate

# README "Cost and time": estimates from the readiness gate's expectation, the Helm limits and
# EC2 launch times, not a measured run.
DEPLOY_MINUTES, DESTROY_MINUTES = "20-30", "5-10"
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
BUDGET = "aws:budgets/budget:Budget"
RUN_LIMIT_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"


def _is_kubernetes_object(r: RecordedResource) -> bool:
    return r.type.startswith("kubernetes:") and r.type != HELM_RELEASE and "apiVersion" in r.inputs


def _is_patch(r: RecordedResource) -> bool:
    return r.type.endswith("Patch")


def plan_elements(rec: Recording) -> list[dict[str, Any]]:
    return [
        {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "parent": r.parent or None,
            "dependsOn": r.depends_on,
            **r.options,
            "inputs": redact(r.inputs),
        }
        for r in sorted(rec.resources, key=lambda r: r.urn)
    ]


def _component_of(r: RecordedResource, by_urn: dict[str, RecordedResource]) -> str:
    """The outermost component a resource belongs to (itself if it has no parent)."""
    top = r
    while top.parent in by_urn:
        top = by_urn[top.parent]
    return f"{top.name} ({top.type})"


def _detail(r: RecordedResource) -> str | None:
    """What the plan says about one resource beyond its type: instance size, chart version."""
    if r.type == INSTANCE_TYPE_TOKEN:
        return r.inputs.get("instanceType")
    if r.type == HELM_RELEASE:
        return f"{r.inputs.get('name')} {r.inputs.get('version')}"
    return None


def _nodes(rec: Recording) -> dict[str, list[RecordedResource]]:
    by_role: dict[str, list[RecordedResource]] = {}
    for r in rec.of_type(INSTANCE_TYPE_TOKEN):
        by_role.setdefault(r.inputs["tags"]["testbed:role"], []).append(r)
    return by_role


def _node_line(role: str, nodes: list[RecordedResource]) -> str:
    types = Counter(n.inputs["instanceType"] for n in nodes)
    spot = sum((n.inputs.get("instanceMarketOptions") or {}).get("marketType") == "spot" for n in nodes)
    disks = sorted({n.inputs["rootBlockDevice"]["volumeSize"] for n in nodes})
    market = f"{spot} spot, {len(nodes) - spot} on-demand" if spot else "on-demand"
    kinds = ", ".join(f"{n} x {typ}" for typ, n in sorted(types.items()))
    return f"  {role}: {kinds} ({market}; root disk {'/'.join(map(str, disks))} GiB gp3)"


def plan_header(rec: Recording) -> list[str]:
    """What a reader checks first: where it goes, what it runs on, who may reach it."""
    s = rec.settings
    (subnet,) = rec.of_type("aws:ec2/subnet:Subnet")
    (group,) = rec.of_type("aws:ec2/securityGroup:SecurityGroup")
    if s.availability_zone:
        types = " and ".join(sorted({s.worker_instance_type, s.control_instance_type}))
        zone = (
            f"{subnet.inputs['availabilityZone']} (configured; whether it offers {types} is not known offline: "
            "`python -m cli preflight` checks it)"
        )
    else:
        zone = (
            f"the first zone of {s.region} offering {s.worker_instance_type}, looked up at `pulumi up` "
            "(`python -m cli preflight` names it)"
        )
    admin = sorted({c for rule in group.inputs["ingress"] for c in rule.get("cidrBlocks", [])})
    ports = sorted({rule["fromPort"] for rule in group.inputs["ingress"] if rule.get("cidrBlocks")})
    lines = [f"stack {s.stack}: region {s.region}, zone {zone}", "nodes:"]
    lines += [_node_line(role, nodes) for role, nodes in sorted(_nodes(rec).items())]
    hourly = pricing.estimate(s).hourly_usd
    lines.append(
        "cost: unknown (no pinned prices for this region; stacks/pricing.py)"
        if hourly is None
        else f"cost: about ${hourly:.2f}/hour, ${hourly * 24:.2f}/day, charged until `pulumi destroy` (estimate below)"
    )
    lines.append(f"deploy: `pulumi up` takes about {DEPLOY_MINUTES} minutes, `pulumi destroy` about {DESTROY_MINUTES}")
    lines.append(f"admin range: {', '.join(admin)} may reach ports {', '.join(map(str, ports))} (SSH, API server)")
    example = [c for c in admin if any(ipaddress.IPv4Network(c).subnet_of(d) for d in DOCUMENTATION_NETWORKS)]
    if example:
        lines.append(
            f"WARNING: adminCidr {', '.join(example)} is the example address: `pulumi up` refuses it; set yours with "
            '`pulumi config set adminCidr "$(curl -s https://checkip.amazonaws.com)/32"`'
        )
    return lines


def cost_lines(rec: Recording, cost: CostEstimate) -> list[str]:
    """The hourly estimate in parts; a type without a pinned price is named, never guessed."""
    s = rec.settings
    prices = pricing.INSTANCE_HOURLY.get(s.region, {})

    def usd(v: float | None) -> str:
        return "unknown" if v is None else f"${v:.4f}/hour"

    nodes = Counter(r.inputs["instanceType"] for r in rec.of_type(INSTANCE_TYPE_TOKEN))
    each = ", ".join(
        f"{n} x {typ} at ${prices[typ]}" if typ in prices else f"{n} x {typ} at unknown"
        for typ, n in sorted(nodes.items())
    )
    disk_gb = sum(r.inputs["rootBlockDevice"]["volumeSize"] for r in rec.of_type(INSTANCE_TYPE_TOKEN))
    gp3 = pricing.GP3_GB_MONTH.get(s.region)
    public_ips = sum(nodes.values())  # the subnet gives every node one; the control's is the Elastic IP
    lines = [
        "estimated cost: "
        + ("unknown" if cost.hourly_usd is None else f"${cost.hourly_usd:.2f}/hour")
        + f" ({cost.basis})",
        f"  instances  {usd(cost.instances_usd)}  ({each})",
        f"  disks      {usd(cost.disks_usd)}  ({disk_gb} GiB gp3 at "
        + ("unknown" if gp3 is None else f"${gp3}/GiB-month")
        + ")",
        f"  addresses  {usd(cost.addresses_usd)}  ({public_ips} public IPv4 at ${pricing.PUBLIC_IPV4_HOURLY} each)",
    ]
    if cost.spot_saving_hourly_usd:
        lines.append(f"  spot saves about ${cost.spot_saving_hourly_usd:.2f}/hour (included above)")
    lines += [
        f"  WARNING: no pinned price for {what} in {s.region} (stacks/pricing.py); the estimate leaves it unknown"
        for what in cost.unpriced
    ]
    return lines


def guard_lines(rec: Recording, cost: CostEstimate) -> list[str]:
    """Where the evidence lives and what watches the bill, as registered."""
    lines = []
    workspaces, grants = rec.of_type(AMP_WORKSPACE_TYPE_TOKEN), rec.of_type(IAM_ROLE_POLICY)
    roles = rec.of_type(IAM_ROLE_TYPE_TOKEN)
    for workspace in workspaces:
        kept = "kept after `pulumi destroy`" if workspace.options.get("retainOnDelete") else "deleted with the stack"
        actions = sorted({s["Action"] for g in grants for s in json.loads(g.inputs["policy"])["Statement"]})
        boundaries = sorted({r.inputs["permissionsBoundary"].rpartition(":policy/")[2] for r in roles})
        lines.append(
            f"evidence: AMP workspace {workspace.inputs['alias']} ({kept}); the control node's Prometheus "
            f"remote-writes the evidence series with {', '.join(actions)} on that workspace only, within the "
            f"boundary {', '.join(boundaries)} an administrator creates once per account (preflight checks it)"
        )
    if not workspaces:
        lines.append(
            "evidence: in the cluster's Prometheus only (managedPrometheus false): `pulumi destroy` deletes it"
        )
    for budget in rec.of_type(BUDGET):
        alarms = budget.inputs["notifications"]
        kinds = " and ".join(sorted(n["notificationType"].lower() for n in alarms))
        emails = sorted({e for n in alarms for e in n["subscriberEmailAddresses"]})
        monthly = "unknown" if cost.hourly_usd is None else f"${cost.hourly_usd * pricing.HOURS_PER_MONTH:,.0f}"
        lines.append(
            f"budget: ${budget.inputs['limitAmount']}/month for the whole account; {kinds} cost above it "
            f"emails {', '.join(emails)} (this stack left running all month: about {monthly})"
        )
    if not rec.of_type(BUDGET):
        lines.append("budget: none (set budgetMonthlyUsd and budgetEmail for a cost alarm)")
    return lines


def runnable_input_lines(rec: Recording) -> list[str]:
    """Where the scaler reads runnable Slurm work (the exporter the program deploys, its token
    user) and what it reads while that input is lost."""
    (token,) = [reveal(r.inputs) for r in rec.of_type(f"kubernetes:{runnable_exporter.TOKEN_API}:Token")]
    meta = token["metadata"]
    return [
        f"runnable Slurm work: read from slurmrestd by {meta['namespace']}/{meta['name']} (the runnable-jobs "
        f"exporter; token user {token['spec']['username']}, {token['spec']['lifetime']}, refreshed; job_submit.lua "
        "refuses that user's jobs): pending jobs Slurm would start now, not --begin before its time, a dependency "
        "unmet, a hold or an array throttle",
        f"  its series missing ({runnable_exporter.MISSING_ALERT}): slurmctld's pending minus held jobs instead, work "
        f"pending beside idle nodes for {slurmd_scaling.STALL_SECONDS} s left out for "
        f"{slurmd_scaling.STALL_MEMORY_SECONDS // 60} min",
    ]


def slurm_limit_lines(rec: Recording) -> list[str]:
    """Each partition's MaxNodes and MaxTime as the rendered slurm.conf sets them, and how MaxTime applies."""
    conf = slurm_files(rec)["slurm.conf"]
    nodes, minutes = slurm_config.partition_max_nodes(conf), slurm_config.partition_max_minutes(conf)
    lines = [f"partition {p}: MaxNodes={nodes[p]}, MaxTime={minutes[p]} minutes" for p in sorted(nodes)]
    # slurmctld's limit check runs every PERIODIC_TIMEOUT, 30 s (SchedMD/slurm@slurm-25-11-6-1:
    # src/slurmctld/slurmctld.h, job_mgr.c job_time_limit).
    lines.append(
        f"run limit: a job without --time runs under MaxTime; slurmctld ends one still running at its limit as "
        f"TIMEOUT, checking every 30 s: a drained node's job ends at most {minutes[DEFAULT_PARTITION]} min 30 s "
        "after it started (slurmJobMaxMinutes)"
    )
    return lines


def wrap_lines(text: str, width: int) -> str:
    """Each line cut at spaces to `width` columns, continued under its own indent and four more
    spaces; a word longer than the width (a URL) stays whole."""
    out = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=indent + "    ",
            break_long_words=False,
            break_on_hyphens=False,
        ) or [""]
    return "\n".join(out)


def plan_text(rec: Recording) -> str:
    by_urn = {r.urn: r for r in rec.resources}
    groups: dict[str, dict[str, list[str | None]]] = {}
    for r in rec.resources:
        if not r.type.startswith("testbed:"):  # a component heads its own group
            groups.setdefault(_component_of(r, by_urn), {}).setdefault(r.type, []).append(_detail(r))
    lines = plan_header(rec)
    lines.append(f"{len(rec.resources)} resources:")
    for group in sorted(groups):
        lines.append(group)
        for typ, details in sorted(groups[group].items()):
            named = Counter(d for d in details if d)
            extra = "  " + ", ".join(f"{d} x{n}" if n > 1 else d for d, n in sorted(named.items())) if named else ""
            lines.append(f"  {len(details):3d}  {typ}{extra}")
    lines.append("install order on the cluster (<- the steps each waits for, by the names on the left):")
    lines += install_order(rec)
    lines.append("GPU fairness policy (Kueue):")
    names = Names.from_settings(rec.settings)
    lines += ["  " + line for line in kueue.policy_lines(names.shares)]
    bounds = slurmd_scaling.stack_reclaim_bounds(names)
    lines += [
        "  " + line
        for line in slurmd_scaling.bounds_lines(bounds, names.slurm_job_max_minutes, names.ai_job_max_minutes)
    ]
    contract = fair_share.contract_lines(
        names.shares.hpc_gpus,
        names.shares.ai_guaranteed_gpus,
        slurmd_scaling.DEFAULT_POLICY,
        f"{FAIR_SHARE_NAMESPACE}/{FAIR_SHARE_CONTROLLER}",
    )
    lines += ["  " + line for line in contract]
    policies = [reveal(r.inputs) for r in rec.of_type(RUN_LIMIT_POLICY)]  # every policy the program creates
    lines += ["    " + line for line in fair_share_controller.quota_policy_lines(policies)]
    lines += ["  " + line for line in runnable_input_lines(rec)]
    starvation = fair_share_controller.no_starvation_bounds(names)  # the controller's turn limit too
    lines += ["  " + line for line in fair_share.no_starvation_lines(starvation, slurmd_scaling.FAIR_SHARE)]
    lines += ["  " + line for line in ai_run_limit.policy_lines(ai_run_limit.limits(policies))]
    lines.append("Slurm limits (slurm.conf; job_submit.lua refuses a job over one at submit):")
    lines += ["  " + line for line in slurm_limit_lines(rec)]
    cost = pricing.estimate(rec.settings)
    lines += cost_lines(rec, cost)
    lines += guard_lines(rec, cost)
    return "\n".join(lines)


def step_arguments(cmd: RecordedResource, which: str = "create") -> dict[str, str]:
    """The arguments, by name, of a remote step's create (or delete) command."""
    return remote_script.parse_command_line(reveal(cmd.inputs[which]))


def embedded_manifests(cmd: RecordedResource) -> list[dict]:
    """Kubernetes objects a remote step carries as JSON arguments (webhook probes)."""
    found = []
    for value in step_arguments(cmd).values():
        if value.startswith("{"):
            obj = json.loads(value)
            if "apiVersion" in obj and "kind" in obj:
                found.append(obj)
    return found


def _manifest_path(out: Path, obj: dict) -> Path:
    meta = obj["metadata"]
    return out / "manifests" / f"{obj['kind']}-{meta.get('namespace', 'cluster')}-{meta['name']}.yaml"


def _step_label(r: RecordedResource) -> str:
    if r.type == HELM_RELEASE:
        return f"helm {r.inputs.get('name')} {r.inputs.get('version')} (ns {r.inputs.get('namespace')})"
    if r.type == REMOTE_COMMAND_TYPE_TOKEN:
        return f"remote step {step_arguments(r)[remote_script.STEP_NAME]}"
    return f"{r.type.split(':')[-1]} {r.inputs.get('metadata', {}).get('name', r.name)}"


# Why a step waits for every step before it, by Helm release name.
_WAITS_FOR_ALL_BECAUSE = {
    keda.chart("").release: "while KEDA's external-metrics APIService is registered but not yet serving, "
    "API discovery fails for every other client (components/keda.py)",
}


def install_order(rec: Recording) -> list[str]:
    """Cluster-side steps in dependency order, each named as the steps that wait for it say."""
    steps = {
        r.urn: r
        for r in rec.resources
        if r.type in (HELM_RELEASE, REMOTE_COMMAND_TYPE_TOKEN) or _is_kubernetes_object(r)
    }
    providers = {r.urn: r for r in rec.of_type("pulumi:providers:kubernetes")}

    def waits_for(r: RecordedResource) -> set[str]:
        deps = set(r.depends_on)
        provider_urn = r.provider.rsplit("::", 1)[0]
        if provider_urn in providers:
            deps |= set(providers[provider_urn].depends_on)
        return {d for d in deps if d in steps}

    pending = {urn: waits_for(r) for urn, r in steps.items()}
    closure: dict[str, set[str]] = {}

    def behind(urn: str) -> set[str]:
        """Every step `urn` waits for, directly or through another."""
        if urn not in closure:
            closure[urn] = set(pending[urn]).union(*(behind(d) for d in pending[urn]))
        return closure[urn]

    for urn in steps:
        behind(urn)
    lines: list[str] = []
    done: set[str] = set()
    while pending:
        ready = sorted((u for u, deps in pending.items() if deps <= done), key=lambda u: steps[u].name)
        if not ready:
            raise ValueError("dependency cycle among cluster steps")
        for urn in ready:
            step = steps[urn]
            if len(pending[urn]) > 5 and closure[urn] == done:  # a long list that says "all of them"
                after = f"every step above ({len(done)})"
                why = _WAITS_FOR_ALL_BECAUSE.get(step.inputs.get("name", "")) if step.type == HELM_RELEASE else None
                after += f": {why}" if why else ""
            else:
                after = ", ".join(sorted(steps[d].name for d in pending[urn])) or "nothing"
            lines.append(f"  {len(lines) + 1:2d}. {step.name}: {_step_label(step)}  <- {after}")
            done.add(urn)
            del pending[urn]
    return lines


def _node_name(instance: RecordedResource) -> str:
    return instance.name.removesuffix("-instance")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def slurm_files(rec: Recording) -> dict[str, str]:
    """slurmctld's /etc/slurm as slurm-operator assembles it from the slurm release's values."""
    (release,) = [r for r in rec.of_type(HELM_RELEASE) if reveal(r.inputs)["chart"].endswith(f"/{SLURM_CHART}")]
    inputs = reveal(release.inputs)
    values = inputs.get("values") or {}
    (nodeset,) = [key for key, nodeset in values.get("nodesets", {}).items() if nodeset.get("enabled")]
    return slurm_config.slurm_files(values, SlurmNames(inputs["name"], inputs["namespace"], nodeset))


def render(rec: Recording, out: Path) -> list[Path]:
    """Write every deployed artifact under `out`; return the files written."""
    scripts: dict[str, str] = {}
    written: list[Path] = []

    def add_script(name: str, text: str) -> None:
        if scripts.get(name, text) != text:
            raise ValueError(f"two different scripts would be rendered as scripts/{name}")
        scripts[name] = text

    for instance in rec.of_type(INSTANCE_TYPE_TOKEN):
        user_data = reveal(instance.inputs["userData"])
        path = out / "cloud-init" / f"{_node_name(instance)}.yaml"
        _write(path, user_data)
        written.append(path)
        for f in trusted_yaml.load(user_data).get("write_files", []):
            if f["path"].endswith(".sh"):
                add_script(Path(f["path"]).name, bootstrap.file_text(f))
    manifests = [reveal(r.inputs) for r in rec.resources if _is_kubernetes_object(r) and not _is_patch(r)]
    # A server-side-apply patch is a few fields of an object another release owns, not an object:
    # written apart, so nothing applies or validates it as a whole one.
    for r in rec.resources:
        if _is_kubernetes_object(r) and _is_patch(r):
            patch = reveal(r.inputs)
            path = out / "patches" / f"{patch['kind']}-{patch['metadata']['name']}.yaml"
            _write(path, trusted_yaml.dump(patch, sort_keys=True))
            written.append(path)
    for cmd in rec.of_type(REMOTE_COMMAND_TYPE_TOKEN):
        add_script(step_arguments(cmd)[remote_script.STEP_NAME], remote_script.script_of(reveal(cmd.inputs["stdin"])))
        manifests += embedded_manifests(cmd)

    releases = []
    for release in sorted(rec.of_type(HELM_RELEASE), key=lambda r: r.name):
        inputs = reveal(release.inputs)
        name = inputs["name"]
        releases.append(
            {
                "release": name,
                "namespace": inputs.get("namespace"),
                "chart": inputs["chart"],
                "version": inputs.get("version"),
                "repo": (inputs.get("repositoryOpts") or {}).get("repo"),
            }
        )
        path = out / "values" / f"{name}.yaml"
        _write(path, trusted_yaml.dump(inputs.get("values") or {}, sort_keys=True))
        written.append(path)
    path = out / "releases.json"
    _write(path, json.dumps(releases, indent=2, sort_keys=True) + "\n")
    written.append(path)
    for name, text in slurm_files(rec).items():
        path = out / "slurm" / name
        _write(path, text)
        written.append(path)

    for obj in manifests:
        manifest = {
            k: v
            for k, v in obj.items()
            if k
            in (
                "apiVersion",
                "kind",
                "metadata",
                "spec",
                "data",
                "stringData",
                "type",
                "rules",
                "roleRef",
                "subjects",
                "value",  # WorkloadPriorityClass keeps these at the top level
                "description",
            )
        }
        path = _manifest_path(out, manifest)
        _write(path, trusted_yaml.dump(manifest, sort_keys=True))
        written.append(path)
    (out / "manifests").mkdir(parents=True, exist_ok=True)

    for name, text in sorted(scripts.items()):
        path = out / "scripts" / name
        _write(path, text)
        written.append(path)
    return written


# `render --out DIR` writes a fresh tree and swaps it in, so a directory holds exactly one
# render (no testbed-worker-3.yaml left from a larger workerCount). The mark tells a previous
# render, which may be replaced, from any other directory, which is never touched.
RENDER_MARK = ".testbed-render"
RENDER_NAME_RESERVE = 14  # render_replacing's temporary names beside it: ".<name>.old." and 8 random characters
MARK_TEXT = "written by `python -m cli render`; the next render replaces this directory whole\n"


def out_dir_problem(out: Path) -> str | None:
    """Why `out` cannot take a render, or None: it must be new, empty, or a previous render, and
    leave room in its name for the temporary directories beside it (render_replacing)."""
    if problem := user_files.names_problem("--out", out, reserve=RENDER_NAME_RESERVE):
        return problem
    try:
        return _render_dir_problem(out) or user_files.out_dir_problem("--out", out)
    except OSError as error:
        return f"--out: {show(str(out))} cannot be used ({error.strerror or error.__class__.__name__})"


def _render_dir_problem(out: Path) -> str | None:
    if out.is_symlink():
        return f"--out: {show(str(out))} is a symbolic link; expected a directory path"
    if out.exists() and not out.is_dir():
        return f"--out: {show(str(out))} is a file; expected a directory (new, empty, or a previous render)"
    if out.is_dir() and any(out.iterdir()) and not (out / RENDER_MARK).is_file():
        return (
            f"--out: {show(str(out))} is not empty and holds no previous render (no {RENDER_MARK}); "
            "expected a new or empty directory, or one that render wrote"
        )
    return None


def render_replacing(rec: Recording, out: Path) -> list[Path]:
    """Render into a new directory beside `out`, then put it in place of `out` whole."""
    problem = out_dir_problem(out)
    if problem:
        raise ValueError(problem)
    out.parent.mkdir(parents=True, exist_ok=True)
    # mkdtemp makes it 0700, and so the render: user-data holds join tokens
    fresh = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written = [fresh / RENDER_MARK, fresh / ".gitignore", *render(rec, fresh)]
        (fresh / RENDER_MARK).write_text(MARK_TEXT)
        (fresh / ".gitignore").write_text("*\n")  # user-data holds secrets: never committed by accident
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / out.name)
            fresh.rename(out)
            shutil.rmtree(old)
        else:
            fresh.rename(out)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    return [out / p.relative_to(fresh) for p in written]
