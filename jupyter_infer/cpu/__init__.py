"""What runs on the CPU: our C kernels (``csrc/``, built, probed and declared in
``build.py`` and ``kernels.py``), the linears and embeddings they compute, the CPU's
features, and this process's memory. Imports nothing of the engine."""
