"""Views of the Across texts tab: an analysis over a corpus turned into its mean map, one cell's items and a note
that says what n is and what the interval is."""
