"""On-disk formats shared by the curate stages, the trainer and the flows (shards, the mix plan,
the dataset layout, rollback records and which data they reverted).

Imports nothing of ours but the repository port (``versioning``), which records are read
through, so ``tasks``, ``training`` and ``flows`` may all import it.
"""
