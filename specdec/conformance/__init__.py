"""`specdec verify`: the conformance check of exactness (check.py) and its statistics (exactness.py)."""
