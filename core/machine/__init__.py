"""The machine the model runs on: how the process hands freed memory back (allocator.py, loaded before torch) and
how a measured cost grows with the length (growth.py). Imports nothing, so the allocator loads alone."""
