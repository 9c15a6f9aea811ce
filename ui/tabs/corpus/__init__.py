"""The tabs that live in their own folder: the Across texts tab (across.py), each analysis over a corpus."""
