"""Tests of cdcserver/embedded/: the embedded store through pymongo and its parts."""
