"""accord: a MongoDB-native transactional state-and-memory platform for LangGraph agents."""

from accord.errors import AccordError, ConcurrentRunError, ConfigurationError, EngineStartError

__all__ = ["AccordError", "ConcurrentRunError", "ConfigurationError", "EngineStartError"]
__version__ = "0.1.0"
