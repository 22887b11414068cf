"""Data the binary trains on without a download (the original's input
pipelines stay in `dataset`): `embedded_task`, multi-digit addition as text.
"""
