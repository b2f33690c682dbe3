"""Telemetry: observers of step records that turn them into OpenTelemetry spans and
Prometheus metrics. Nothing else in the engine imports OpenTelemetry; the scheduler
never sees this package."""
