"""The protocol layer's one error family: anything a peer sends that we cannot read."""


class ProtocolError(Exception):
    """Base class for every error raised while reading or writing Kafka protocol bytes."""


class ProtocolDecodeError(ProtocolError):
    """Bytes that do not form a valid message of the version they claim to be."""


class FrameTooLargeError(ProtocolError):
    """A frame whose declared size exceeds the configured maximum (checked before allocating)."""


class UnsupportedApiError(ProtocolError):
    """A request for an API key or version the proxy cannot decode."""


class CorrelationError(ProtocolError):
    """A response that does not answer the oldest in-flight request on its connection."""


class TruncatedFrameError(ProtocolDecodeError):
    """The peer went away in the middle of a frame."""
