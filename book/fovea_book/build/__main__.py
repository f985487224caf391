import sys

from fovea_book.build.cli import main

sys.exit(main())
