"""The performance benchmarks: each ``bench_NAME.py`` measures figures and prints them
beside their targets, alone (``python benchmarks/bench_NAME.py [--quick]``) or all
together (``python -m benchmarks``, ``schedscope bench``; docs/benchmarks.md).

A package only so that ``python -m benchmarks`` runs; the benchmarks are scripts,
run each in its own process, and import nothing from here.
"""
