"""The load generator: profiles run by Locust, measured per request (docs/loadgen.md).

One concept per module, each importing only what it needs so that the harness can
merge records without importing gevent or Locust:

- ``options``     the custom command-line arguments (``--rate-scale``, ``--endpoint``, ...)
- ``split``       a plan cut into one worker's share (request i -> worker i mod W)
- ``prompts``     request bodies with exact prompt lengths (token ids, /tokenize sizing)
- ``client``      the streaming OpenAI client and its per-request measurement (gevent)
- ``target_values`` what a target may send: each value the client reads, checked and bounded
- ``body_lines``  a streamed body's lines, each within a length bound
- ``records``     the per-process JSON-lines writer and the per-process summary
- ``dispatcher``  open-loop dispatch at the scheduled instants, closed-loop loops (gevent)
- ``expose``      ``expose(PROFILE, globals())``: the line a profile file ends with
                  (no Locust import)
- ``locust_user`` ``define(profile, namespace)``: the Locust user, shape and listeners,
                  routing Locust's events to the parts below
- ``process_run`` one process's run of its share (``ProcessRun``), ``cut_notice`` (gevent)
- ``request_events`` a row as Locust's request events (``TTFT``, ``E2E``, ``CUT``, ...)
- ``run_end``     the end-of-run report lines and exit code from the processes' summaries
- ``master_side`` a distributed run's master: numbering, splits, summaries, lost workers,
                  ``workers.json``
- ``worker_side`` a distributed run's worker: its hello, the master's split and stop
- ``clock_probes`` the master's clock-offset probes of its workers, the worker's answer
- ``merge``       a records directory -> ``requests.parquet`` + ``summary.json`` (polars)
- ``row_types``   the merge's check of each row's types (a bad value: null, the row an error)
"""
