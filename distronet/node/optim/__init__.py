"""The DisTrO optimizer: config and presets (``config``), packets (``packets``), update rules, optimizer."""
