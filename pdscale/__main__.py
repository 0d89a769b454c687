import sys

from pdscale._cli._common import EXIT_INTERRUPTED
from pdscale.cli import main

try:
    code = main()
except KeyboardInterrupt:  # Ctrl-C landing between the command's return and the exit
    code = EXIT_INTERRUPTED
sys.exit(code)
