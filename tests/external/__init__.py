"""Harnesses for the external contract suites (LangGraph's tests, pymongo's spec tests)."""
