"""Workspace files (W1-W6) and what moves them: the file service, workspace access, artifacts,
transfers and their plans.
"""
