"""Policies: model backends that turn prompts into sampled actions with log-probs."""
