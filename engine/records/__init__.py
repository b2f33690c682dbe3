"""What a step leaves behind: the self-contained ``StepRecord`` and the observers that
read it (token timing first, then the server's streams, the record writers, telemetry).
An observer reads the record and nothing else of the scheduler.
"""
