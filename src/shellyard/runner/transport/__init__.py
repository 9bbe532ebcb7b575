"""A runner on another host: the wire (each Runner method over HTTP), the daemon that serves it,
the client that speaks it, request signing, TLS and SSH carriage.
"""
