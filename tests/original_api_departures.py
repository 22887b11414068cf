"""Where this project departs from the original's public API, and why.

DEPARTURES maps "module.name" to the reason (TF1-only names that cannot mean
anything on TF2, ...); each is also listed in CONTRIBUTING.md. PENDING holds
names still being brought in line: it must shrink to nothing.
"""

DEPARTURES = {}

PENDING = frozenset([
])
