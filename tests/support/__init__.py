"""Helpers shared by the tests (no tests here): servers, recorded histories, oplog builders."""
