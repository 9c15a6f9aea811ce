"""python -m core.lab.sinks: see the package's docstring."""
import sys

from . import main

sys.exit(main())
