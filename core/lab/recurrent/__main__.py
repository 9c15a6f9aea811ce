"""python -m core.recurrent: train the GRU and the attention decoder side by side (core/recurrent/__init__.py)."""
import sys

from core.recurrent import main

sys.exit(main())
