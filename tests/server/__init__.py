"""Tests of the server: commands, cursors, the hub, auth, TLS, drivers, sources, the CLI."""
