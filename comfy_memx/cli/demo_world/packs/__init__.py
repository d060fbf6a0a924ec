"""Custom-node packs of the demo world (copied under a ``custom_nodes`` folder before they are loaded)."""
