"""Wire formats: request bodies in, answers out. The fields every body shares (``fields``),
the native body (``native``), chat messages and tools (``chat``), the OpenAI routes' bodies
(``openai_requests``) and answers (``openai_answers``), a reasoning model's answer split
(``reasoning``), and the upstream server's request and chunk formats (``upstream_openai``). Pure functions on values: no I/O, no engine."""
