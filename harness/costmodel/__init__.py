"""The simulator's cost models as this harness keeps them: the machine a fit belongs to
(``machine``), the per-user store of fits (``store``), the step cycles behind a pooled
fit (``evidence``) and which fit a command uses (``choice``). Rule: no runs and no
servers here; fitting a model from runs is ``harness.calibration``'s."""
