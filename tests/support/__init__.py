"""Helpers the tests share: engines and executors built for a test, a headless browser
for the report, and the repository's paths. Imported as ``tests.support.*``."""
