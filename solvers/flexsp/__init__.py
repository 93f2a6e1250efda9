"""FlexSP: per-step sequence-parallel groups for variable-length batches (ASPLOS'25, arXiv 2412.01523)."""
