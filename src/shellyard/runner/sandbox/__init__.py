"""One sandbox from argv to end: bubblewrap's argv, the seccomp filter, the launcher that sets the
limits, spawning, supervising on the pidfd, the sandbox uid's way through a private home.
"""
