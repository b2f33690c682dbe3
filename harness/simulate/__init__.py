"""The simulator's driver: the engine's own scheduler on a virtual clock with a cost
model (``driver``), the speed band of a simulation (``speed_band``) and the table
``schedscope simulate`` prints (``compare``). Rule: it runs no model and no server.

``harness.simulate`` was the module that is now ``harness.simulate.driver``: its names
still resolve here, with a warning (docs/architecture.md).
"""

from engine.moved_modules import moved_names

__getattr__ = moved_names(
    "harness.simulate",
    "harness.simulate.driver",
    {"driver", "speed_band", "compare"},
)
