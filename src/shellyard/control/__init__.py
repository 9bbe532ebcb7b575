"""The control plane: one service object over the Store and the Runner protocol."""
