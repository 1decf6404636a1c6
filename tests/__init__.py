"""The test suite, a package: its modules import each other and the helpers in tests/support/
as `tests.<dir>.<module>` (the repository root is on sys.path under pytest)."""
