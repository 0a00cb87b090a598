"""Packet exchange: the optimizer's view of the network (``base``), in-memory swarm, faulty wrapper."""
