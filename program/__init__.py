"""Layers of the testbed, composed in order by `program.testbed.build`."""
