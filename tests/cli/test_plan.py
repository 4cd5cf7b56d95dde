"""`python -m cli plan` explains itself: where, what, who may reach it, in what order, at what cost."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from cli import artifacts
from components import runnable_exporter
from components import slurmd_scaling as scaling
from stacks import offline, pricing
from stacks.offline import reveal
from tests import tokens
from tests.conftest import ADMIN_CIDR, by_type, depends, run_program
from twin import report


def with_settings(rec, **changes):
    return dataclasses.replace(rec, settings=dataclasses.replace(rec.settings, **changes))


def test_the_plan_opens_with_stack_region_zone_nodes_and_admin_range(default_run, spot_run):
    head = artifacts.plan_header(default_run)
    assert head[0].startswith("stack dev: region us-east-1, zone the first zone of us-east-1 offering g4dn.xlarge")
    assert "  control-plane: 1 x t3.medium (on-demand; root disk 40 GiB gp3)" in head
    assert "  gpu-worker: 4 x g4dn.xlarge (on-demand; root disk 100 GiB gp3)" in head
    assert head[-2] == f"admin range: {ADMIN_CIDR} may reach ports 22, 6443 (SSH, API server)"
    # the tests' address is a documentation address, as the example stack's is: `pulumi up` refuses it
    assert head[-1].startswith(f"WARNING: adminCidr {ADMIN_CIDR} is the example address: `pulumi up` refuses it")
    assert "  gpu-worker: 4 x g4dn.xlarge (4 spot, 0 on-demand; root disk 100 GiB gp3)" in artifacts.plan_header(
        spot_run
    )
    configured = artifacts.plan_header(with_settings(default_run, availability_zone="us-east-1a"))
    assert configured[0] == (
        "stack dev: region us-east-1, zone us-east-1a (configured; whether it offers g4dn.xlarge and t3.medium is "
        "not known offline: `python -m cli preflight` checks it)"
    )


def test_the_summary_gives_the_daily_cost_and_the_deploy_time_and_warns_only_for_an_example_address(default_run):
    head = artifacts.plan_header(default_run)
    hourly = pricing.estimate(default_run.settings).hourly_usd
    (cost,) = [line for line in head if line.startswith("cost: ")]
    assert (
        cost
        == f"cost: about ${hourly:.2f}/hour, ${hourly * 24:.2f}/day, charged until `pulumi destroy` (estimate below)"
    )
    assert "$53." in cost, "4 x g4dn.xlarge and a t3.medium in us-east-1: about $53 a day"
    assert "deploy: `pulumi up` takes about 20-30 minutes" in "\n".join(head)
    own = artifacts.plan_header(run_program(adminCidr="81.2.69.0/28"))
    assert "admin range: 81.2.69.0/28 may reach ports 22, 6443 (SSH, API server)" in own
    assert not [line for line in own if line.startswith("WARNING")]
    elsewhere = artifacts.plan_header(with_settings(default_run, region="af-south-1"))
    assert "cost: unknown (no pinned prices for this region; stacks/pricing.py)" in elsewhere
    assert not any(line.startswith("None/") for line in artifacts.plan_text(default_run).splitlines())


def test_waits_for_uses_the_names_of_the_install_list(default_run):
    lines = artifacts.install_order(default_run)
    names = [re.match(r"\s+\d+\. (\S+): ", line)[1] for line in lines]
    assert len(names) == len(set(names))
    for index, line in enumerate(lines):
        after = line.split("  <- ", 1)[1]
        if after.startswith("every step above"):
            continue
        waited = [] if after == "nothing" else after.split(", ")
        assert set(waited) <= set(names[:index]), line  # only names listed earlier


def test_keda_waits_for_everything_and_says_why(default_run):
    lines = artifacts.install_order(default_run)
    (keda,) = [(i, line) for i, line in enumerate(lines) if ": helm keda " in line]
    index, line = keda
    assert f"<- every step above ({index}): while KEDA's external-metrics APIService" in line
    # and it really does: its release (or its provider) waits for every earlier step, directly or not
    release = default_run.named("testbed-keda-release")
    provider = next(r for r in default_run.resources if r.urn == release.provider.rsplit("::", 1)[0])
    for earlier in lines[:index]:
        step = default_run.named(re.match(r"\s+\d+\. (\S+): ", earlier)[1])
        assert depends(default_run, release, step) or depends(default_run, provider, step), earlier


def test_cost_is_broken_down_and_adds_up(default_run):
    cost = pricing.estimate(default_run.settings)
    lines = artifacts.cost_lines(default_run, cost)
    assert lines[0] == f"estimated cost: ${cost.hourly_usd:.2f}/hour ({cost.basis})"
    assert cost.instances_usd + cost.disks_usd + cost.addresses_usd == pytest.approx(cost.hourly_usd)
    assert "4 x g4dn.xlarge at $0.526, 1 x t3.medium at $0.0416" in lines[1]
    assert "(440 GiB gp3 at $0.08/GiB-month)" in lines[2] and "(5 public IPv4 at $0.005 each)" in lines[3]
    assert not any("WARNING" in line for line in lines)


def test_a_type_without_a_price_is_named_not_guessed(default_run):
    rec = with_settings(default_run, worker_instance_type="g6.xlarge")
    lines = artifacts.cost_lines(rec, pricing.estimate(rec.settings))
    assert lines[0].startswith("estimated cost: unknown (no pinned price for g6.xlarge in us-east-1)")
    assert lines[-1].startswith("  WARNING: no pinned price for g6.xlarge in us-east-1")
    rec = with_settings(default_run, region="ap-south-1")
    warned = [line for line in artifacts.cost_lines(rec, pricing.estimate(rec.settings)) if "WARNING" in line]
    assert [w.split(" for ")[1].split(" in ")[0] for w in warned] == ["t3.medium", "g4dn.xlarge", "gp3"]


def test_plan_json_shows_which_worker_waits_for_which(default_run, deployed_run):
    """What `plan --json` prints: each worker's dependsOn and its joined step's lifecycle options."""

    def elements(rec):
        return {e["name"]: e for e in json.loads(json.dumps(artifacts.plan_elements(rec)))}

    first, deployed = elements(default_run), elements(deployed_run)
    control = first["testbed-control-instance"]["urn"]
    joined = [f"testbed-worker-{i}-joined" for i in range(4)]
    for i, name in enumerate(joined):
        for plan in (first, deployed):
            step = plan[name]
            assert plan[f"testbed-worker-{i}-instance"]["urn"] in step["dependsOn"]
            assert (step["deletedWith"], step["replaceWith"], step["deleteBeforeReplace"]) == (control, [control], True)
    for i in range(1, 4):
        waits = set(deployed[f"testbed-worker-{i}-instance"]["dependsOn"])
        assert waits & {deployed[j]["urn"] for j in joined} == {deployed[joined[i - 1]]["urn"]}
        assert not set(first[f"testbed-worker-{i}-instance"]["dependsOn"]) & {first[j]["urn"] for j in joined}


@pytest.mark.parametrize("minutes", [None, 90])
def test_the_plan_shows_each_partitions_maxtime_beside_its_maxnodes(default_run, minutes):
    # with the reclaim-bound test's AI limit below, which no Slurm limit reads: one recording for both
    rec = default_run if minutes is None else run_program(slurmJobMaxMinutes=minutes, aiJobMaxMinutes=20)
    limits = artifacts.plan_text(rec).split(
        "Slurm limits (slurm.conf; job_submit.lua refuses a job over one at submit):\n"
    )[1]
    want = minutes or 60  # slurmJobMaxMinutes' documented default
    for partition in ("all", "slinky"):
        assert f"  partition {partition}: MaxNodes=4, MaxTime={want} minutes\n" in limits
    assert f"as TIMEOUT, checking every 30 s: a drained node's job ends at most {want} min 30 s after it" in limits


@pytest.mark.parametrize("slurm_minutes, ai_minutes", [(None, None), (90, 20)])
def test_the_plan_states_each_reclaim_bound_from_the_limits_the_engines_enforce(default_run, slurm_minutes, ai_minutes):
    """The bounds are derived from the rendered slurm.conf's MaxTime and the admission policy's limit
    (not the settings echoed back): Slurm's end lags its limit by one 30 s check and KillWait (30 s),
    and each hand-off adds two 30 s scrapes, a 30 s poll, a 15 s HPA sync and a 30 s termination."""
    changes = {k: v for k, v in (("slurmJobMaxMinutes", slurm_minutes), ("aiJobMaxMinutes", ai_minutes)) if v}
    rec = run_program(**changes) if changes else default_run
    text = artifacts.plan_text(rec)
    maxtime = int(re.search(r"partition all: MaxNodes=\d+, MaxTime=(\d+) minutes", text)[1])
    ai_limit = int(re.search(r"max-exec-time-seconds, at most (\d+) s", text)[1])
    handoff = 2 * 30 + 30 + 15 + 30

    def said(seconds: int) -> str:
        return f"{seconds // 60} min {seconds % 60} s" if seconds % 60 else f"{seconds // 60} min"

    assert f"AI gets its share back within {said(maxtime * 60 + 60 + handoff)}:" in text
    assert f"HPC gets its share back within {said(ai_limit + handoff)}:" in text
    assert f"starts within {said(120 + max(maxtime * 60 + 60, ai_limit) + handoff)}" in text
    assert f"a freed GPU reaches waiting work within {handoff} s" in text
    assert f"a hold released) gets a GPU free to Slurm within {handoff} s: the runnable-jobs exporter" in text
    # The no-starvation bounds beside the fair-share contract (components/fair_share.py)
    assert f"starts within {ai_limit + maxtime * 60 + 60 + handoff} s of that side's turn" in text
    assert f"a GPU held idle for a Slurm backfill plan is held at most {maxtime * 60 + 60} s" in text


@pytest.mark.parametrize("slurm_minutes", [None, 90])
def test_the_plan_states_each_bound_under_one_lost_input_and_its_alert(default_run, slurm_minutes):
    """One line per lost input of the scaler, with the alert that names it and the four waits,
    "D + " where the outage counts: derived from the rendered MaxTime like the bounds above it."""
    rec = run_program(slurmJobMaxMinutes=slurm_minutes) if slurm_minutes else default_run
    text = " ".join(artifacts.plan_text(rec).split())  # unwrapped
    maxtime = int(re.search(r"partition all: MaxNodes=\d+, MaxTime=(\d+) minutes", text)[1])
    b = scaling.reclaim_bounds(30, 30, maxtime, 60)
    assert "one input lost for D s (policies lend-and-reclaim, fair-share; the alert after 2 min names it):" in text
    for row in scaling.outage_bounds(b):
        line = text.split(f"{row.lost} ({row.alert}): the scaler ", 1)[1].split(" HPC's share back within ")[0]
        ai = scaling._minutes(b.ai_share_back_s)
        assert f"AI's share back within {'D + ' if scaling.AI_SHARE_BACK in row.plus_outage else ''}{ai}," in line
    kueue = text.split("Kueue's metrics (KueueMetricsMissing): ", 1)[1]
    assert kueue.split(";")[0].endswith("stay drained") and "a first-in-line AI job within D + " in kueue
    # Without the runnable-jobs exporter (the alert its own rule group fires): the stall memory, 30 min
    exporter = text.split(f"the runnable-jobs exporter ({runnable_exporter.MISSING_ALERT}): the scaler ", 1)[1]
    hpc, runnable = scaling._minutes(b.hpc_share_back_s + 1800), scaling._minutes(b.handoff_s + 1800)
    assert (
        f"HPC's share back within {hpc}, work that becomes runnable within {runnable}"
        in exporter.split(" one input")[0]
    )
    assert f"work that becomes runnable within D + {b.handoff_s} s" in kueue


@pytest.mark.parametrize("ai_gpus", [None, 1])
def test_the_plan_states_the_fair_share_contract_beside_the_bounds(default_run, ai_gpus):
    """Beside today's bounds, the contract of the program's policy, fair-share: named as the policy
    whose quota trigger the recorded ScaledObject carries and whose controller the program deploys
    (the recorded Deployment); each side's guaranteed share from the plan's own Kueue split, the
    twin's report window, 5 points, and the widest job the window allows (an eighth of its GPU time)."""
    rec = run_program(aiGuaranteedGpus=ai_gpus) if ai_gpus else default_run
    text = artifacts.plan_text(rec)
    total = int(re.search(r"GPUs: (\d+) \(cohort", text)[1])
    hpc = int(re.search(r"HPC \(slurmd pods, [^)]*\): (\d+) guaranteed", text)[1])
    ai = int(re.search(r"AI \(LocalQueue [^)]*\): (\d+) guaranteed", text)[1])
    assert (hpc + ai, ai) == (total, ai_gpus or total // 2)
    hours = report.FAIR_WINDOW_S / 3600  # the window the twin's fairness report slides
    contract = text.split("a freed GPU reaches waiting work within")[1]
    (scaled_object,) = by_type(rec, tokens.SCALED_OBJECT)
    triggers = {tr["name"] for tr in reveal(scaled_object.inputs)["spec"]["triggers"]}
    assert scaling.AI_QUOTA in triggers, "the deployed scaler follows the controller's quota"
    (deployment,) = [r for r in by_type(rec, tokens.DEPLOYMENT) if r.parent == rec.named("testbed-fair-share").urn]
    meta = reveal(deployment.inputs)["metadata"]
    assert f"(policy {scaling.FAIR_SHARE}: its controller runs as {meta['namespace']}/{meta['name']}," in contract
    assert f"within 5 points: HPC {100 * hpc // total}% ({hpc} of {total} GPUs), AI {100 * ai // total}%" in contract
    minutes = hours * 60 * total / 8  # an eighth of the window's GPU time, in GPU-minutes
    assert f"over the run, when no job holds more than 1/8 of a window's GPU time: a {total}-GPU job up to " in contract
    assert f"{minutes / total:g} min, a 1-GPU job up to {minutes:g} min" in contract
    assert f"over every {hours:g} h window in which both had work at least 50% of the time, within 5 points" in contract
    assert f"a {total}-GPU job of {minutes / total:g} min adds 12.5 points)" in contract


@pytest.mark.parametrize(("columns", "width"), [("72", 72), (None, 100)])
def test_the_plan_fits_the_terminal_and_loses_no_word(default_run, monkeypatch, capsys, columns, width):
    """Wrapped to $COLUMNS (what shutil reads for the terminal), else 100 when not on a terminal
    (capsys is not one); the words are the plan's, in order."""
    from cli import __main__ as cli

    monkeypatch.setattr(offline, "run", lambda *args, **kwargs: default_run)
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    too_wide = [line for line in out.splitlines() if len(line) > width and " " in line.strip()]
    assert too_wide == []
    assert max(len(line) for line in artifacts.plan_text(default_run).splitlines()) > 300  # there was work to do
    assert out.split() == artifacts.plan_text(default_run).split()
    continued = [line for line in out.splitlines() if line.startswith("      testbed-")]
    assert continued, "an install step's long list of waits continues under its own indent"


def test_the_plan_names_the_runnable_work_input_and_its_fallback(default_run):
    """The exporter the program deploys (its recorded Token: namespace, name, user, lifetime), the
    series the scaler reads from it, and what the scaler reads while they are missing."""
    text = " ".join(artifacts.plan_text(default_run).split())  # unwrapped
    (token,) = [reveal(r.inputs) for r in by_type(default_run, tokens.SLURM_TOKEN)]
    meta, spec = token["metadata"], token["spec"]
    assert (
        f"runnable Slurm work: read from slurmrestd by {meta['namespace']}/{meta['name']} (the runnable-jobs "
        f"exporter; token user {spec['username']}, {spec['lifetime']}, refreshed;" in text
    )
    (scaled_object,) = by_type(default_run, tokens.SCALED_OBJECT)
    queries = " ".join(t["metadata"]["query"] for t in reveal(scaled_object.inputs)["spec"]["triggers"])
    assert "testbed_slurm_runnable_jobs" in queries and "slurm_partition_jobs_pending" in queries
    fallback = text.split("its series missing (SlurmRunnableJobsMissing): ")[1]
    assert fallback.startswith(
        f"slurmctld's pending minus held jobs instead, work pending beside idle nodes for "
        f"{scaling.STALL_SECONDS} s left out for {scaling.STALL_MEMORY_SECONDS // 60} min"
    )
