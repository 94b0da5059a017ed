"""Rollouts: prompt rendering, players, the batched multi-episode arena, opponent pools."""
