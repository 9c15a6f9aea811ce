"""The services of the Across texts tab: a corpus chosen (built in or uploaded) and checked, and an analysis of
core/corpus run over it in a worker thread, streamed with the summary of the items finished so far."""
