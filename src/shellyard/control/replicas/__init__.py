"""Several control-plane replicas on one database (docs/operations.md): leases of ongoing work, the
PostgreSQL fan-out, and the wiring of both into the services.
"""
