"""The sync savers, generated from ``accord/checkpointers/asynchronous`` by ``tools/synchro.py``."""
