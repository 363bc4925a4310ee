"""Governance: the policy per artifact class and its enforcement on every operation.

Only :mod:`accord.runtime` imports this package; it registers the policy's hook on every
kernel it builds, so every door (savers, also built alone, the store, the aggregator, the
HTTP API, MCP, the CLI) is checked by it. docs/governance.md is the user's guide.
"""
