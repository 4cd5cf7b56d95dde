"""What every layer reads: the settings, the one reader of user files, the instance catalogue, the
names contract and the hosts' layout. Plain Python and PyYAML: nothing here imports Pulumi."""
