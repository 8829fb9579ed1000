"""Data preparation for train_gpt.py: tokenizers and token shards in the challenge's format.

The scripts run as `python data/<script>.py` (or `python -m data.<script>`) from the repo root;
see data/README.md.
"""
