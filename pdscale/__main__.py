import sys

from pdscale.cli import main

sys.exit(main())
