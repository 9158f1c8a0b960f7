"""Oversized request heads answer 414 / 431 instead of a dropped connection.

Why: Daphne parses HTTP with Twisted's HTTPChannel, which bounds a request's head (a line: 16 KiB,
LineReceiver.MAX_LENGTH; request line + headers: 16 KiB, totalHeadersSize; 500 headers,
maxHeaders) but answers a line past the bound by closing the connection (lineLengthExceeded) and
the other bounds with a bare 400. Clients then saw a reset, not a status they can act on
(issue 25 item 5: a 60 KB header, a 25 KB URL). Here the same bounds answer
* 414 URI Too Long when the request line is past them,
* 431 Request Header Fields Too Large when a header line, the headers' total or their count is,
with a JSON body in the OpenAI envelope (the Anthropic SDK reads the status and any JSON) and
`Connection: close`. The connection is then half-closed (FIN after the answer) and what the client
still sends is read and dropped for LINGER_S, so that its unread bytes do not make the kernel
reset the connection before the client has read the answer.
Invariant: requests within the bounds are parsed by Twisted exactly as before.
"""
import json
from collections.abc import Callable
from typing import Any

from twisted.web import http as twisted_http

HeadAnswer = tuple[int, bytes, str, str]  # status, reason, message, error code

LINGER_S = 2.0

URI_TOO_LONG = (414, b"URI Too Long", "The request URL is too long.", "uri_too_long")
HEADERS_TOO_LARGE = (431, b"Request Header Fields Too Large",
                     "The request's header fields are too large.", "request_header_fields_too_large")


def _head_answer(status: int, reason: bytes, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                 "code": code}}).encode()
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n" % (status, reason, len(body))) + body


def refuse_head(channel: twisted_http.HTTPChannel, answer: HeadAnswer) -> None:
    """Answers `answer` (URI_TOO_LONG / HEADERS_TOO_LARGE) and ends the connection politely."""
    transport: Any = channel.transport  # an ITransport: mypy reads zope interfaces' methods unbound
    setattr(channel, "dataReceived", lambda data: None)  # nothing more is parsed on this connection
    setattr(channel, "lineReceived", lambda line: None)
    if transport is None:
        return
    transport.write(_head_answer(*answer))
    try:
        transport.loseWriteConnection()
    except (AttributeError, NotImplementedError):
        transport.loseConnection()
        return
    from twisted.internet import reactor

    # twisted types the reactor module as its interface class, whose methods mypy reads unbound.
    reactor.callLater(LINGER_S, transport.loseConnection)  # type: ignore[arg-type]


def _on_first_line(channel: twisted_http.HTTPChannel) -> bool:
    return bool(getattr(channel, "_HTTPChannel__first_line", 0))


def _line_length_exceeded(self: twisted_http.HTTPChannel, line: bytes) -> None:
    refuse_head(self, URI_TOO_LONG if _on_first_line(self) else HEADERS_TOO_LARGE)


LineHandler = Callable[[twisted_http.HTTPChannel, bytes], Any]


def _bounded_line(line_received: LineHandler) -> LineHandler:
    def lineReceived(self: twisted_http.HTTPChannel, line: bytes) -> Any:
        if self._receivedHeaderSize + len(line) > self.totalHeadersSize:
            return refuse_head(self, URI_TOO_LONG if _on_first_line(self) else HEADERS_TOO_LARGE)
        return line_received(self, line)

    setattr(lineReceived, "head_bounds", True)
    return lineReceived


def _bounded_header(header_received: LineHandler) -> LineHandler:
    def headerReceived(self: twisted_http.HTTPChannel, line: bytes) -> Any:
        if self._receivedHeaderCount >= self.maxHeaders:
            refuse_head(self, HEADERS_TOO_LARGE)
            return False
        return header_received(self, line)

    return headerReceived


def install() -> None:
    """Idempotent: patches twisted.web.http.HTTPChannel (Daphne's parser) once."""
    channel = twisted_http.HTTPChannel
    if getattr(channel.lineReceived, "head_bounds", False):
        return
    setattr(channel, "lineReceived", _bounded_line(channel.lineReceived))
    setattr(channel, "headerReceived", _bounded_header(channel.headerReceived))
    setattr(channel, "lineLengthExceeded", _line_length_exceeded)
