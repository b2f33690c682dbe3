"""``schedscope tune``: search the engine's knobs in the simulator for the most load a
profile can take while every class meets its SLOs, then confirm the best configurations
by serving them (docs/tune.md).

One concept per module: :mod:`slo` (the ``--slo`` targets), :mod:`space` (the knobs
searched and their ranges), :mod:`objective` (one configuration's capacity under SLO,
or its goodput, in the simulator), :mod:`search` (Optuna's TPE over the space, trials
in a process pool), :mod:`front` (the Pareto front), :mod:`diagnose` (the traps of the
finalists and the rejected), :mod:`confirm` (the finalists served as ``schedscope run``
cells), :mod:`outputs` (tune.json, tune.md, tune.html, the command lines).
"""
