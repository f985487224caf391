import sys

from fovea_core.book.cli import main

sys.exit(main())
