"""paraplan GPU worker: pulls runs, executes plans with torch.distributed, profiles hardware."""
