"""Tests of cdcserver/sharding/: the embedded sharded cluster."""
