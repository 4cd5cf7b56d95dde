"""Replays the reference experiments on the testbed and proves each GPU had one owner at a time."""
