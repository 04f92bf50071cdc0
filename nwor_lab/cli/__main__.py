import sys

from nwor_lab.cli.main import main

sys.exit(main())
