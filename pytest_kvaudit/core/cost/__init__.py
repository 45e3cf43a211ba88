"""Arithmetic on lengths and records, no torch: the price of a run (pricing), the ledger a run writes and
reads, and the evidence a claim needs (how many units a verdict takes)."""
