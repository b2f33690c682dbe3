"""Real execution with torch: the bundled Llama-architecture model over a paged KV
cache, its configuration and weights, the sampler, and the model runner that turns a
``SchedulerOutput`` into tensors and a ``StepResult``. CUDA when present, else CPU.
"""
