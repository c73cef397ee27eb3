import sys

from mnemesh.cli import main

sys.exit(main())
