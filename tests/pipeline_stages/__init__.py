"""Tests of pipeline_stages/: the $changeStream pipeline, resume tokens, the stages."""
