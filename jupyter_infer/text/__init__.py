"""The text side of a model, apart from the engine: what a tokenizer can stand for, and a
checkpoint's own generation defaults and reasoning markers."""
