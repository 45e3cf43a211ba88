"""A run's computation: the cell builder and its transplants, the probes, and the store that runs them once
per run and holds every record the claims read. Each step declares its price beside its code."""
