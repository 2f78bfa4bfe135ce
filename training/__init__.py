"""Pure-PyTorch training: model, loader, checkpoints, loop. Never imports Prefect."""
