"""``schedscope calibrate``'s two methods: profiling the model runner over step shapes
(``profiling``) and a served run made for it (``served``). Rule: it may drive runs
(``harness.run``); it stores what it fits through ``harness.costmodel``."""
