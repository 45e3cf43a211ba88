"""kvaudit's built-in claims, one test file each: shipped in the package as ``pytest_kvaudit.suites``."""
