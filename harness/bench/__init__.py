"""Running the benchmarks of ``benchmarks/`` as one command (docs/benchmarks.md):

- ``figure``: one measured figure beside its target, and its verdict;
- ``script``: the benchmark side of the contract (``BenchParser``, ``bench_main``);
- ``collect``: the benchmarks of a folder, checked against the contract, and a subset;
- ``runner``: one benchmark in a subprocess, its figures read back;
- ``table``: the one table of every figure;
- ``results``: the results file (fingerprint, versions, date, figures);
- ``suite``: all of it, for ``python -m benchmarks`` and ``schedscope bench``.
"""
