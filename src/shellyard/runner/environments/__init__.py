"""Managed environments on a runner (V1-V8): the store of prefixes and changes, creating and
deriving them, base environments, the allowed sources, the package managers.
"""
