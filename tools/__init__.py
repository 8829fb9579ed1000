"""The tools a researcher runs from the repository root (python tools/compare.py ...): tools/README.md.
A package so that train_gpt.py's import of tools.packing finds this folder before any other "tools"."""
