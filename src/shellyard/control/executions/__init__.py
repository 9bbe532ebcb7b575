"""Durable executions (E1-E12): the service, the hooks it needs of others, its record's contract
view, capped inline output, foreground waits across replicas, log lines.
"""
