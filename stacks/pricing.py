"""Pinned on-demand prices for the hourly estimate (Linux, USD per hour).

Recorded from the AWS public price pages (EC2 On-Demand, EBS, public IPv4) on 2025-12-01;
prices change, so the estimate says which table it used. Spot prices float: the plan shows
the saving at SPOT_DISCOUNT_ASSUMED, an assumption, not a quote."""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import Settings

PRICES_DATED = "2025-12-01"
HOURS_PER_MONTH = 730
PUBLIC_IPV4_HOURLY = 0.005  # every public IPv4 address, Elastic or not
SPOT_DISCOUNT_ASSUMED = 0.60  # typical g4dn spot discount; varies by zone and hour

INSTANCE_HOURLY = {
    "us-east-1": {"t3.medium": 0.0416, "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g5.xlarge": 1.006},
    "us-east-2": {"t3.medium": 0.0416, "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g5.xlarge": 1.006},
    "us-west-2": {"t3.medium": 0.0416, "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g5.xlarge": 1.006},
    "eu-west-1": {"t3.medium": 0.0456, "g4dn.xlarge": 0.587, "g4dn.2xlarge": 0.838, "g5.xlarge": 1.123},
    "eu-central-1": {"t3.medium": 0.048, "g4dn.xlarge": 0.658, "g4dn.2xlarge": 0.94, "g5.xlarge": 1.258},
}
GP3_GB_MONTH = {"us-east-1": 0.08, "us-east-2": 0.08, "us-west-2": 0.08, "eu-west-1": 0.088, "eu-central-1": 0.0952}


@dataclass(frozen=True)
class CostEstimate:
    hourly_usd: float | None  # None: a price is not in the table
    on_demand_workers_hourly_usd: float | None
    spot_saving_hourly_usd: float  # 0 unless spotWorkers
    basis: str
    # The parts of hourly_usd (None where a price is missing) and what the table lacks.
    instances_usd: float | None = None
    disks_usd: float | None = None
    addresses_usd: float | None = None
    unpriced: tuple[str, ...] = ()  # instance types (or gp3) with no pinned price in the region


def estimate(s: Settings) -> CostEstimate:
    prices = INSTANCE_HOURLY.get(s.region, {})
    control, worker = prices.get(s.control_instance_type), prices.get(s.worker_instance_type)
    unpriced = tuple(t for t in dict.fromkeys((s.control_instance_type, s.worker_instance_type)) if t not in prices)
    storage_gb = s.control_root_volume_gb + s.worker_count * s.worker_root_volume_gb
    gp3 = GP3_GB_MONTH.get(s.region)
    storage = None if gp3 is None else round(storage_gb * gp3 / HOURS_PER_MONTH, 4)
    addresses = round((1 + s.worker_count) * PUBLIC_IPV4_HOURLY, 4)
    workers = None if worker is None else s.worker_count * worker
    saving = workers * SPOT_DISCOUNT_ASSUMED if s.spot_workers and workers is not None else 0.0
    instances = None if control is None or workers is None else round(control + workers - saving, 4)
    unpriced += () if gp3 is not None else ("gp3",)
    if instances is None or storage is None or workers is None:  # workers None makes instances None
        return CostEstimate(
            None,
            None,
            0.0,
            f"no pinned price for {', '.join(unpriced)} in {s.region}",
            instances,
            storage,
            addresses,
            unpriced,
        )
    total = instances + storage + addresses
    basis = f"on-demand prices for {s.region} dated {PRICES_DATED}"
    if s.spot_workers:
        basis += f"; spot workers assumed {SPOT_DISCOUNT_ASSUMED:.0%} below on-demand"
    return CostEstimate(
        round(total, 4), round(workers, 4), round(saving, 4), basis, instances, storage, addresses, unpriced
    )
