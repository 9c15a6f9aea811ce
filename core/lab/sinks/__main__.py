"""python -m core.sinks_lab: see the package's docstring."""
import sys

from . import main

sys.exit(main())
