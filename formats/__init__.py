"""On-disk formats shared by the curate stages and the trainer (shards, the mix plan).

Imports nothing of ours, so both ``tasks`` and ``training`` may import it.
"""
