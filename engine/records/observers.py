"""The engine's one observer list: who hears about each step record, safely.

Observers run on the engine's thread right after each step, in the order they were
added, so they must be cheap (a few microseconds per step is the budget; batch or
hand off anything slower). An observer that raises is logged (once per observer,
then every 1,000th failure) and counted; the step, its requests and the other
observers go on as if nothing happened: observing the engine never changes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine.records.step_record import StepRecord

log = logging.getLogger("schedscope.engine")

Observer = Callable[[StepRecord], None]


class ObserverList:
    def __init__(self) -> None:
        self._observers: list[Observer] = []
        self.num_errors = 0
        self.errors_by_observer: dict[str, int] = {}

    def add(self, observer: Observer) -> Observer:
        self._observers.append(observer)
        return observer

    def remove(self, observer: Observer) -> None:
        self._observers.remove(observer)

    def __len__(self) -> int:
        return len(self._observers)

    def __contains__(self, observer: Observer) -> bool:
        return observer in self._observers

    def notify(self, record: StepRecord) -> None:
        for observer in self._observers:
            try:
                observer(record)
            except Exception:
                self._failed(observer)

    def _failed(self, observer: Observer) -> None:
        self.num_errors += 1
        name = getattr(observer, "__qualname__", None) or type(observer).__qualname__
        count = self.errors_by_observer.get(name, 0) + 1
        self.errors_by_observer[name] = count
        if count == 1 or count % 1000 == 0:
            log.exception(
                "step observer %s failed (%d times so far); the engine goes on", name, count
            )
