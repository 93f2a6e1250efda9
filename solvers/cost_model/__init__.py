"""The cost model: time and memory of a training step under any hybrid strategy."""
