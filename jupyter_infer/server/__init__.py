"""The Jupyter server extension: ``InferApp`` (configuration and lifecycle) and its handlers."""
