"""The built-in item sets (``builtin:...``): generated, seeded, shipped with the package."""
