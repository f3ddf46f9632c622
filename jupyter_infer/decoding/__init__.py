"""How a row chooses its tokens: sampling, logits processors, and what a step costs by its
width (a grammar's forced runs). Draft tokens are ``speculative``'s."""
