"""What the apps prompt with: the task prompt sets (prompts.py) built from text on every machine (corpus.py)."""
