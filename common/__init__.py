"""What every mode shares and is not what the suite compares: config, data, metrics,
telemetry, logging, checkpoints."""
