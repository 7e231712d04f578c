"""A root after the write (publish, validation, cleanup, history), what a run's end means, and
the write operator's decisions around its attempts.
"""
