import sys

from nwor_lab.sweep.cli import main

sys.exit(main())
