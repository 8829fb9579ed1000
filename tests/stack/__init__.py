"""The technique stack's tests (stack/), each run against the built trainer. A package, so that its conftest.py
is stack.conftest and the name conftest stays tests/conftest.py for the files of tests/."""
