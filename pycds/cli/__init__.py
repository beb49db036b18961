"""The command line, ``python -m pycds`` (main), with its ``bench`` and
``cache`` commands."""
