"""The weight store's errors: each names the model or file that is wrong and what would be right."""


class WeightsError(RuntimeError):
    """Base of every weight-store error."""


class WeightsUnavailable(WeightsError):
    """No source of a model could be reached; the message lists each source tried and why it failed."""


class ChecksumMismatch(WeightsError):
    """An installed file differs from the sha256 or size its manifest records."""


class UnknownModel(WeightsError):
    """A name that is neither registered, installed, a local folder nor a hub repo id."""


class SourceFailed(Exception):
    """One source could not deliver; the store moves on to the next and reports this reason."""
