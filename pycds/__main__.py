"""``python -m pycds``: the command line (pycds.cli.main)."""

from .cli.main import run

if __name__ == "__main__":
    run()
