"""The repository's comparisons against other servers and libraries, kept out of the wheel.

``jupyter infer bench`` (in the package) measures ours; ``python -m benchmarks`` (``make
bench``) runs the same suite with everyone else beside ours, in one run: ``generate`` one at a
time and in one padded batch (``generate_baselines``), transformers' continuous batching
(``hf_continuous``) and ``transformers serve``, llama.cpp's ``llama-server`` (``peers``), the
CPU forward pass against llama.cpp (``cpu``) and at a real size (``real_size``), and
grammar libraries against each other (``grammar_libs``, run on its own). docs/benchmark.md
says how to read and reproduce them.
"""
