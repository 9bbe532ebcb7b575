"""Runners: places where commands run. One protocol, local and remote implementations."""
