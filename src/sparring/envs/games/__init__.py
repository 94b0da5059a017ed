"""Built-in games. Each module registers its environment with `register_env` on import."""
