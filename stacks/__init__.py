"""Layers of the testbed, composed in order by `stacks.testbed.build`."""
