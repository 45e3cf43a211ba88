"""Before and around a run: the plan (a calibrated estimate and an upper bound, from the declared prices),
the price on a recorded ledger, and the baseline a gate compares with."""
