"""PyMongo's wider test files: the tests that fail against cdcserver, and why.

Written by `python tests/pymongo_suite/pymongo_suite_harness.py update` from a run
(then read: an "unclassified" cause needs a pattern in CAUSES). Each is a strict
xfail in test_pymongo_suite.py, its reason the text of the cause in CAUSES.
"""
# ruff: noqa: E501  (PyMongo's test names are long)

KNOWN_FAILURES: dict[str, dict[str, str]] = {
    'test/test_collection.py': {
    },
    'test/test_database.py': {
    },
    'test/test_cursor.py': {
    },
    'test/test_bulk.py': {
    },
    'test/test_session.py': {
    },
    'test/test_raw_bson.py': {
    },
    'test/test_custom_types.py': {
    },
    'test/test_crud_unified.py': {
    },
    'test/test_sessions_unified.py': {
    },
    'test/test_retryable_reads_unified.py': {
    },
    'test/test_retryable_writes_unified.py': {
    },
    'test/test_read_write_concern_spec.py': {
    },
    'test/test_command_monitoring.py': {
    },
    'test/test_command_logging.py': {
    },
    'test/test_versioned_api_integration.py': {
    },
    'test/test_client_bulk_write.py': {
    },
    'test/test_transactions.py': {
    },
    'test/test_transactions_unified.py': {
        'TestUnifiedRunCommand::test_run_command_fails_with_explicit_secondary_read_preference': 'no-secondary',
        'TestUnifiedRunCommand::test_run_command_fails_with_secondary_read_preference_from_transaction_options': 'no-secondary',
        'TestUnifiedReadPref::test_secondary_readPreference': 'no-secondary',
    },
    'test/asynchronous/test_collection.py': {
    },
    'test/asynchronous/test_database.py': {
    },
    'test/asynchronous/test_cursor.py': {
    },
    'test/asynchronous/test_bulk.py': {
    },
    'test/asynchronous/test_session.py': {
    },
    'test/asynchronous/test_transactions.py': {
    },
    'test/asynchronous/test_transactions_unified.py': {
        'TestUnifiedRunCommand::test_run_command_fails_with_explicit_secondary_read_preference': 'no-secondary',
        'TestUnifiedRunCommand::test_run_command_fails_with_secondary_read_preference_from_transaction_options': 'no-secondary',
        'TestUnifiedReadPref::test_secondary_readPreference': 'no-secondary',
    },
    'test/test_client.py': {
    },
    'test/asynchronous/test_client.py': {
    },
}
