"""The training lab: configurations and comparisons (configs), jobs and each session's runs (runs)."""
