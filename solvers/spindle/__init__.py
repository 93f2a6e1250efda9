"""Spindle: wavefront schedules for multi-task multi-modal training (arXiv 2409.03365).

A training step is a DAG of metaops (one module of one task); a plan is a set of slices, each running some
layers of one metaop data-parallel on a contiguous block of devices for a time interval.
"""
