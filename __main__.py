"""Pulumi entry point: load settings, build the testbed, export its outputs."""

import pulumi

from core import settings
from stacks import testbed

try:
    loaded = testbed.settings_from_pulumi()
except settings.SettingsError as error:
    raise pulumi.RunError("invalid settings:\n" + str(error)) from None

for name, value in testbed.build(loaded).items():
    pulumi.export(name, value)
