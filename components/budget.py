"""A cost alarm: an AWS Budget for the account's monthly cost that emails when the forecast, or
the actual cost, passes the limit. The forecast alarm is the one that matters for a testbed left
running: AWS forecasts the month from the spend so far, so it fires days before the bill does."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

# Notify above 100 % of the limit, for the forecast and for the actual cost (AWS Budgets
# "Creating a cost budget": notification types FORECASTED and ACTUAL, threshold in percent).
ALARMS = ("FORECASTED", "ACTUAL")
THRESHOLD_PERCENT = 100


@dataclass
class BudgetAlarmArgs:
    monthly_usd: int
    email: str


def notifications(email: str) -> list[aws.budgets.BudgetNotificationArgsDict]:
    return [
        {
            "notification_type": kind,
            "comparison_operator": "GREATER_THAN",
            "threshold": THRESHOLD_PERCENT,
            "threshold_type": "PERCENTAGE",
            "subscriber_email_addresses": [email],
        }
        for kind in ALARMS
    ]


class BudgetAlarm(pulumi.ComponentResource):
    def __init__(self, name: str, args: BudgetAlarmArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("testbed:aws:BudgetAlarm", name, None, opts)
        # The whole account's cost, not only the stack's: filtering by the stack's tag needs the
        # tag activated as a cost allocation tag first (up to 24 hours, by the payer account), and a
        # filter on a tag not yet active matches nothing, so the alarm would never fire.
        self.budget = aws.budgets.Budget(
            f"{name}-monthly",
            budget_type="COST",
            time_unit="MONTHLY",
            limit_amount=str(args.monthly_usd),
            limit_unit="USD",
            notifications=notifications(args.email),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"limitUsd": args.monthly_usd})
