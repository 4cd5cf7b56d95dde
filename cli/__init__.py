"""The command-line tools, `python -m cli COMMAND` (or the `testbed` command): plan, render,
preflight, doctor, e2e, validate and simulate. They sit on top of every other layer."""
