"""slurmctld's configuration files as slurm-operator v1.0.0 assembles them from the `slurm` chart's
values: what `render` writes to DIR/slurm/, what the real-Slurm tests boot slurmctld from, and what
the twin's Slurm reads its partitions from. A pure function of the values the program deploys.

Followed, at SlinkyProject/slurm-operator@v1.0.0:
* internal/builder/controller_config.go buildSlurmConf: the fixed lines, their order, and the NodeSet
  and partition lines of every enabled NodeSet; buildCgroupConf when configFiles has no cgroup.conf.
* internal/utils/config/config.go: `Key=Value` lines joined by newlines, with a final newline.
* internal/builder/common.go, controller_app.go, worker_app.go: user, ports, paths and auth plugins.
* api/v1beta1/controller_keys.go: ClusterName `<namespace>_<Controller name>`, SlurmctldHost
  `<Controller name>-controller-0(<service>.<namespace>)`.
* helm/slurm/templates/controller/_helpers.tpl `slurm.controller.extraConf`, helm/slurm/templates/
  _helpers.tpl `_toList` and nodeset/_helpers.tpl `slurm.worker.partitionConfig`: a `configMap` is
  `Key=Value` pairs in key order (Helm ranges a map sorted), list values joined by commas, empty
  values dropped; the partitions follow controller.extraConf(Map).
"""

from __future__ import annotations

from core.names import SLURMCTLD_PORT, SlurmNames

SLURMD_PORT = 6818  # internal/builder/worker_app.go SlurmdPort
SLURM_ETC = "/etc/slurm"
CGROUP_CONF = "cgroup.conf"
# internal/builder/common.go jwtHs256KeyPath and authAltParameters (the same at v1.0.0..v1.0.5):
# the chart's JWT key Secret, mounted beside slurm.conf, is the only option the operator writes.
JWT_KEY_FILE = f"{SLURM_ETC}/jwt_hs256.key"
OPERATOR_AUTH_ALT_PARAMETERS = f"jwt_key={JWT_KEY_FILE}"


def _to_list(config_map: dict) -> list[str]:
    """`_toList`: sorted keys, `Key=a,b` for a list, falsy values left out."""
    items = []
    for key in sorted(config_map):
        value = config_map[key]
        if value:
            values = value if isinstance(value, list) else [value]
            items.append(f"{key}={','.join(str(v) for v in values)}")
    return items


def _config_text(section: dict, text_key: str = "config", map_key: str = "configMap") -> str:
    if section.get(text_key):
        return str(section[text_key])
    return " ".join(_to_list(section.get(map_key) or {}))


def _extra_conf(values: dict) -> str:
    """`slurm.controller.extraConf`: the controller's extra lines, then one line per enabled partition."""
    controller = values.get("controller", {})
    if controller.get("extraConf"):
        lines = str(controller["extraConf"]).split("\n")
    else:
        lines = _to_list(controller.get("extraConfMap") or {})
    nodesets = ["ALL", *(k for k, v in values.get("nodesets", {}).items() if v.get("enabled"))]
    for name in sorted(values.get("partitions", {})):
        part = values["partitions"][name]
        if not part.get("enabled"):
            continue
        members = [m for m in sorted(set(part.get("nodesets") or [])) if m in nodesets]
        lines.append(" ".join([f"PartitionName={name}", f"Nodes={','.join(members)}", _config_text(part)]))
    return "\n".join(lines)


def slurm_conf(values: dict, n: SlurmNames) -> str:
    """slurm.conf for the chart values `values` (no accounting, metrics as the values say, cgroups on
    unless configFiles' cgroup.conf says `CgroupPlugin=disabled`)."""
    cgroup = "cgroupplugin=disabled" not in values.get("configFiles", {}).get(CGROUP_CONF, "").lower()
    metrics = bool(values.get("controller", {}).get("metrics", {}).get("enabled"))
    cluster = values.get("clusterName") or n.cluster_name
    lines = [
        "#",
        "### GENERAL ###",
        f"ClusterName={cluster}",
        "SlurmUser=slurm",
        f"SlurmctldHost={n.controller_pod}({n.controller_service}.{n.namespace})",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"StateSaveLocation=/var/spool/slurmctld/{cluster}",
        "SlurmdUser=root",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "ReturnToService=2",
        "MaxNodeCount=1024",
        "GresTypes=gpu",
        "#",
        "### LOGGING ###",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmSchedLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "LogTimeFormat=iso8601,format_stderr",
        "#",
        "### PLUGINS & PARAMETERS ###",
        "AuthType=auth/slurm",
        "CredType=cred/slurm",
        "AuthAltTypes=auth/jwt",
        f"AuthAltParameters={OPERATOR_AUTH_ALT_PARAMETERS}",
        "AuthInfo=use_client_ids",
        "CommunicationParameters=block_null_hash",
        "SelectTypeParameters=CR_Core_Memory",
    ]
    if cgroup:
        lines += [
            "SlurmctldParameters=enable_configless,enable_stepmgr",
            "ProctrackType=proctrack/cgroup",
            "PrologFlags=Contain",
            "TaskPlugin=task/cgroup,task/affinity",
        ]
    else:
        lines += ["SlurmctldParameters=enable_configless", "TaskPlugin=task/affinity"]
    if metrics:
        lines.append("MetricsType=metrics/openmetrics")
    lines += [
        "#",
        "### ACCOUNTING ###",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
    ]
    epilogs = sorted(epilog_slurmctld_files(values))
    if epilogs:  # buildSlurmConf: one EpilogSlurmctld=/etc/slurm/<ConfigMap key> per entry, keys sorted
        lines += ["#", "### SLURMCTLD PROLOG & EPILOG ###", *(f"EpilogSlurmctld={SLURM_ETC}/{e}" for e in epilogs)]
    enabled = {k: v for k, v in values.get("nodesets", {}).items() if v.get("enabled")}
    if enabled:
        lines += ["#", "### COMPUTE & PARTITION ###"]
    # The operator lists NodeSet objects by name (slurm-worker-<key>); the chart sets each pod
    # template's hostname to `<key>-`, which names the NodeSet line (nodeset/nodeset-cr.yaml).
    for key in sorted(enabled):
        lines.append(f"NodeSet={key} Feature={key}")
        partition = enabled[key].get("partition") or {}
        if partition.get("enabled"):
            lines.append(" ".join([f"PartitionName={key}", f"Nodes={key}", _config_text(partition)]))
    lines += ["#", "### EXTRA CONFIG ###", _extra_conf(values)]
    return "\n".join(lines) + "\n"


def cgroup_conf() -> str:
    """buildCgroupConf: written when configFiles has no cgroup.conf."""
    return "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"


def slurmd_conf_arg(values: dict, nodeset: str) -> str:
    """slurmd's `--conf` for the NodeSet (worker_app.go slurmdConfArgs): Features=<key> and the
    NodeSet's extraConfMap, sorted `Key=Value` items joined by spaces."""
    conf = {"Features": nodeset}
    for item in _to_list(values["nodesets"][nodeset].get("extraConfMap") or {}):
        key, _, value = item.partition("=")
        key = "Features" if key.title() in ("Feature", "Features") else key.title()
        conf[key] = f"{conf[key]},{value}" if key in conf else value
    return " ".join(sorted(f"{k}={v}" for k, v in conf.items()))


def epilog_slurmctld_files(values: dict) -> dict[str, str]:
    """The EpilogSlurmctld scripts as the operator mounts them in /etc/slurm: the chart's ConfigMap
    names each `epilogSlurmctldScripts` entry `epilog-slurmctld-<key>`
    (SlinkyProject/slurm-operator@v1.0.5: helm/slurm/templates/controller/epilog-slurmctld-configmap.yaml),
    and buildSlurmConf lists that ConfigMap's keys (internal/builder/controller_config.go)."""
    return {f"epilog-slurmctld-{key}": text for key, text in (values.get("epilogSlurmctldScripts") or {}).items()}


def slurm_files(values: dict, n: SlurmNames) -> dict[str, str]:
    """Every file slurmctld reads from /etc/slurm: slurm.conf, cgroup.conf and the chart's configFiles
    (gres.conf, job_submit.lua) and the EpilogSlurmctld scripts."""
    files = {"slurm.conf": slurm_conf(values, n), **epilog_slurmctld_files(values)}
    config_files = dict(values.get("configFiles") or {})
    if CGROUP_CONF not in config_files:
        files[CGROUP_CONF] = cgroup_conf()
    files.update(config_files)
    return files


def conf_lines(conf: str) -> list[dict[str, str]]:
    """slurm.conf parsed as Slurm reads it: one dict per line of space-separated `Key=Value` pairs,
    comments and blank lines left out (doc/man/man5/slurm.conf.5: keywords are case-insensitive)."""
    out = []
    for line in conf.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append({k.lower(): v for k, _, v in (item.partition("=") for item in line.split())})
    return out


def _partition_limit(conf: str, key: str) -> dict[str, int | None]:
    """Each partition's integer `key` in the rendered slurm.conf; None for UNLIMITED (the default)."""
    limits: dict[str, int | None] = {}
    for line in conf_lines(conf):
        if "partitionname" in line:
            value = line.get(key.lower(), "UNLIMITED")
            limits[line["partitionname"]] = None if value.upper() in ("UNLIMITED", "INFINITE") else int(value)
    return limits


def partition_max_nodes(conf: str) -> dict[str, int | None]:
    """Each partition's MaxNodes; None for UNLIMITED."""
    return _partition_limit(conf, "MaxNodes")


def partition_max_minutes(conf: str) -> dict[str, int | None]:
    """Each partition's MaxTime in minutes; None for UNLIMITED. Slurm also reads `h:m:s` and `d-h`
    forms (src/common/parse_time.c time_str2mins); the program writes whole minutes (slurmJobMaxMinutes)
    or the chart's UNLIMITED, and another form here fails loudly in int()."""
    return _partition_limit(conf, "MaxTime")


def global_setting(conf: str, key: str, default: str) -> str:
    """The last value of a global keyword (Slurm keeps the last one read)."""
    values = [line[key.lower()] for line in conf_lines(conf) if len(line) == 1 and key.lower() in line]
    return values[-1] if values else default
