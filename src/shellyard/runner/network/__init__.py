"""A workspace's network: its namespace (mounted as root, held by a process otherwise), forwarded
ports and the relays that carry them, the egress proxy and its rules.
"""
