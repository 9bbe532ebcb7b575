"""Sessions and notifications (N1-N11): sessions and agents, the inbox, wakes, timers."""
