import sys

from qmpprof.cli import main

sys.exit(main(exiting=True))
