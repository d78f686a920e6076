"""Asking an endpoint picker where a request goes, as Envoy does: its ext_proc gRPC stream.

The gateway sends the request's headers and body as `ProcessingRequest`s
(envoy.service.ext_proc.v3) and the picker answers the headers with a header mutation that
sets `x-gateway-destination-endpoint` to the picked `IP:port`. The messages are encoded here
by hand (protobuf wire format, only the fields used) so the harness needs only grpcio.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
DESTINATION_HEADER = "x-gateway-destination-endpoint"


class PickerRefused(RuntimeError):
    """The picker answered with an immediate response (no endpoint) instead of a choice."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _bool_field(number: int, value: bool) -> bytes:
    return _varint(number << 3) + _varint(int(value))


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of one message: bytes for length-delimited, int for varints."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
            yield number, value
        elif wire == 2:
            size, i = _read_varint(buf, i)
            yield number, buf[i:i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not expected from ext_proc")


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _first(buf: bytes, number: int) -> bytes:
    return next((v for n, v in _fields(buf) if n == number and isinstance(v, bytes)), b"")


def request_messages(path: str, body: dict[str, Any]) -> list[bytes]:
    """ProcessingRequest{request_headers (2)} then ProcessingRequest{request_body (4)}:
    HttpHeaders{headers: HeaderMap{HeaderValue{key 1, raw_value 3}}}, HttpBody{body 1,
    end_of_stream 2}."""
    data = json.dumps(body).encode()
    headers = {":method": "POST", ":path": path, ":authority": "gateway",
               "content-type": "application/json", "content-length": str(len(data)),
               "x-request-id": str(uuid.uuid4())}
    header_map = b"".join(_bytes_field(1, _bytes_field(1, k.encode()) + _bytes_field(3, v.encode()))
                          for k, v in headers.items())
    return [_bytes_field(2, _bytes_field(1, header_map)),
            _bytes_field(4, _bytes_field(1, data) + _bool_field(2, True))]


def destination(response: bytes) -> str | None:
    """The `x-gateway-destination-endpoint` a ProcessingResponse sets, if any:
    request_headers (1) -> CommonResponse (1) -> HeaderMutation (2) -> set_headers (1) ->
    HeaderValue (1) with key (1) and value (2) or raw_value (3)."""
    immediate = _first(response, 7)
    if immediate:
        raise PickerRefused(f"the picker answered immediately: {immediate!r}")
    mutation = _first(_first(_first(response, 1), 1), 2)
    for number, option in _fields(mutation):
        if number != 1 or not isinstance(option, bytes):
            continue
        header = dict((n, v) for n, v in _fields(_first(option, 1)))
        if header.get(1) == DESTINATION_HEADER.encode():
            return (header.get(3) or header.get(2) or b"").decode()
    return None


def pick(channel: Any, path: str, body: dict[str, Any], timeout: float = 30) -> str:
    """The `IP:port` the picker behind `channel` (a grpc.Channel) chooses for this request."""
    process = channel.stream_stream(PROCESS)
    for response in process(iter(request_messages(path, body)), timeout=timeout):
        picked = destination(response)
        if picked:
            return picked
    raise PickerRefused("the picker closed the stream without choosing an endpoint")
