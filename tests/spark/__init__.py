"""Tests of cdcserver/spark/: spark-replay and the streaming source (marker `spark`)."""
