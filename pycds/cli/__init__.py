"""The command line, ``python -m pycds``: main, ``bench`` and ``cache``."""
