"""Storage below everything that writes or reads run files: atomic writes
(`sparring.storage.atomic`), checked folders of safetensors files with a manifest
(`sparring.storage.folders`) and the ``metrics.jsonl`` file (`sparring.storage.metrics_file`)."""
