"""python -m core.lab.recurrent: train the GRU and the attention decoder side by side (see the package)."""
import sys

from core.lab.recurrent import main

sys.exit(main())
