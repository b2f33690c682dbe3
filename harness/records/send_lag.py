"""How late the load generator may send a request before its timings are the
generator's as much as the server's (numpy- and polars-free: the load generator's
processes read it)."""

#: A run whose p99 send lag exceeds this is generator-limited (its latencies are the
#: generator's as much as the server's); a calibration leaves out the requests sent
#: later than this (their client latency is the generator's).
LAG_LIMIT_S = 0.010
