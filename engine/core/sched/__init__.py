"""The scheduler, in parts: waiting-queue ordering (``policy``, ``waiting_queue``),
admission of new requests, the batching strategy that fills a step under its budgets,
preemption by swap or recompute, and the ``SchedulerOutput`` a step hands to an
executor. It moves sequences between queues and block ids between pools; it never
touches tensors, sockets or telemetry.
"""
