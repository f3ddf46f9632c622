"""The async loops that run requests: ``request_loop`` (what every loop shares: admission,
cancellation, streams), ``engine_loop`` (a local engine's steps on its own thread),
``upstream_loop`` (an upstream server's streams), ``tokenizing`` (tokenizer calls kept off
Jupyter's event loop) and ``loop_factory`` (the loop a configuration asks for)."""
