"""Async sources of the platform (sync twins are generated into ``synchronous``)."""
