"""KV memory: the dense caches of running rows, the prefix cache, and prefixes shared
between running rows."""
