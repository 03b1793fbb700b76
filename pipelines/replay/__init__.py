"""Replay: send a selection of the lake back through a producer, exactly once, with a ledger."""
