"""A proxy with a controller-mutation quota, and CreateTopics sent as raw frames."""

from __future__ import annotations

import socket
import struct

from kqp.protocol.apis import API_SPECS, CREATE_TOPICS_KEY
from kqp.protocol.codec import decode_body
from kqp.protocol.headers import encode_request_header, response_body_offset

THROTTLING_QUOTA_EXCEEDED = 89




def create_topics_raw(port: int, client_id: str, names: list[str], partitions: int, version: int = 7) -> object:
    """One CreateTopics request, sent as bytes, and its decoded response."""
    request_class = API_SPECS[CREATE_TOPICS_KEY].request_class[version]
    topic_class = request_class.CreatableTopic
    request = request_class(
        topics=[topic_class(name=n, num_partitions=partitions, replication_factor=1, assignments=[], configs=[])
                for n in names],
        timeout_ms=30000, validate_only=False,
    )
    frame = encode_request_header(CREATE_TOPICS_KEY, version, 7, client_id) + bytes(request.encode(version=version))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(sock, 4))[0]
        response = _read(sock, size)
    offset = response_body_offset(response, CREATE_TOPICS_KEY, version)
    return decode_body(CREATE_TOPICS_KEY, version, response[offset:], is_request=False)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "connection closed mid-response"
        data += chunk
    return data
