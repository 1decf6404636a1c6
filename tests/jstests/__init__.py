"""mongod's change-stream jstests translated to pytest (a package, so that module basenames such
as test_split_large_event do not clash with tests/pipeline_stages/test_*.py)."""
