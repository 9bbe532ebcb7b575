"""shellyard: a durable, sandboxed shell for AI agents."""

__version__ = "0.1.0"
