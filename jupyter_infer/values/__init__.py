"""Values every floor shares, and nothing else: configuration (``config``), what a caller
asks for and gets back (``request``), a running sequence (``sequence``), streamed events
(``stream``, ``events``), counters (``metrics``), length limits (``limits``), what serves the
requests (``engine_info``) and sample prompts (``prompts``). Imports only ``errors``."""
