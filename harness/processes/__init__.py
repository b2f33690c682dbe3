"""The child processes the harness starts (servers, Locust, Prometheus, benchmarks) and
how each is ended: one way, :func:`harness.processes.stop.stop_process`. Rule: the
standard library only; every folder that starts a process may import it."""
