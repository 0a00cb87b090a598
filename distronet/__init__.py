"""distro-node: volunteers train one shared model over home internet (DisTrO/DeMo compression)."""
