"""Running an engine for clients: the async engine that drives the step loop off the
event loop and streams tokens, the engine-core process that owns the step loop (as
vLLM V1's EngineCore), and the tokenizer the API uses.
"""
