import sys

from nwor_lab.workshop.cli import main

sys.exit(main())
