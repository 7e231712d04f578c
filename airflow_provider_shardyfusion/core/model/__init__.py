"""What is stored and the rules every side share (manifest, run record, pointer, routing), and
``SnapshotRoot``: the one object through which a root is read and changed.
"""
