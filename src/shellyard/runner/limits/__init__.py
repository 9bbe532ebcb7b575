"""The limits of a runner (R2; docs/limits.md): their settings, the watcher of quota and log cap
while commands run, the free-space reserve, retention of a runner's logs.
"""
