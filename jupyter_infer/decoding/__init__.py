"""How a row chooses its tokens: sampling, logits processors, n-gram drafts, and what a
step costs by its width."""
