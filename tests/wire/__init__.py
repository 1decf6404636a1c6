"""Tests of cdcserver/wire/: message framing, and generated wire messages against a server."""
