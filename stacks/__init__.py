"""The Pulumi program: the testbed's layers (infrastructure, cluster, platform, workloads) and
pricing, composed in order by `stacks.testbed.build`; the root's __main__.py is its entry."""
