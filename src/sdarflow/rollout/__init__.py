"""Multi-turn rollouts: generation engines behind one interface (``engine``: hf anywhere, vLLM on GPUs and CPUs), prompt
building, env hosting (in this process or a worker) and the batched loop that turns episodes into trajectory rows.
"""
