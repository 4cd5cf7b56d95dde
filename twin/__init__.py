"""The hand-off twin: a discrete-time model of Slurm, Prometheus, KEDA, the HPA, the Slinky NodeSet
controller and Kubernetes, each behaviour citing the upstream file it follows (see each module)."""
