"""Embedding tables placed by the strategy: the table, its rows' blocks and ids, its row updates."""
