"""Reachability probes of `make compose-check` (deploy/compose/check.sh), run wherever a probe must come
from: inside a container of the stack (``docker exec -i CID python - ARGS < probe.py``), on the host, and
in a second network namespace routed through the host (``ip netns exec NS python3 probe.py ARGS``).

Each argument is ``"WANT METHOD URL"``: WANT is an HTTP status, a ``|``-list of them, or ``unreachable``
(no such name, connection refused, no route, timeout: nothing answered). METHOD ``POST:<N>MiB`` (or
``POST:<N>MiB:chunked``) sends a body of N MiB of zeros, unsigned, with a Content-Length (or chunked): what
the Fleet proxy must refuse with 413 before the SuperLink reads it (:func:`post_body`; tests/test_deploy.py
sends the same requests to the local deployment). TLS is not verified here (a probe by IP address must
still see the proxy's answer); what is checked is who answers at all, and with what. Prints one line per
probe, prefixed with ``PROBE_FROM``; exits 1 if any answer is not the wanted one. Standard library only (the
images and the host have no fedpers).
"""

import os
import socket
import ssl
import sys
import urllib.error
import urllib.request

UNREACHABLE = "unreachable"


def status(method: str, url: str, timeout: float = 4.0) -> str:
    """The HTTP status ``method url`` gets, or why nothing answered (no-name, refused, timeout, ...)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    req = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method,
                                 headers={"Content-Type": "application/protobuf"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=timeout) as res:
            return str(res.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, socket.gaierror):
            return "no-name"
        if isinstance(reason, ConnectionRefusedError):
            return "refused"
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return "timeout"
        if isinstance(reason, OSError):
            return f"os-error:{reason.strerror or reason}"
        return f"error:{reason}"
    except (socket.timeout, TimeoutError):
        return "timeout"
    except (ConnectionError, OSError) as exc:
        return f"os-error:{type(exc).__name__}"


def post_body(url: str, size: int, chunked: bool = False, context: ssl.SSLContext | None = None,
              timeout: float = 60.0) -> str:
    """POST ``size`` bytes of zeros (no node signature) to an https ``url`` with a Content-Length, or chunked;
    the answer's status code, or why there was none. The body is sent whole unless the server closes the
    connection first (nginx answers 413 at once for a declared length, and once a chunked body passes its
    bound)."""
    host_port, _, path = url.split("://", 1)[1].partition("/")
    host, _, port = host_port.rpartition(":")
    if context is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, int(port or 443)), timeout=timeout)
    except OSError as exc:
        return f"os-error:{type(exc).__name__}"
    with context.wrap_socket(raw, server_hostname=host) as tls:
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
        tls.sendall(f"POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/protobuf\r\n"
                    f"{framing}\r\n\r\n".encode())
        block, sent = bytes(2**20), 0
        try:
            while sent < size:
                piece = block[: size - sent]
                tls.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
                sent += len(piece)
            if chunked:
                tls.sendall(b"0\r\n\r\n")
        except OSError:  # closed by the server after its answer
            pass
        try:
            line = tls.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
        except OSError as exc:
            return f"os-error:{type(exc).__name__}"
    parts = line.split()
    return parts[1] if len(parts) > 1 and parts[1].isdigit() else f"no-status:{line[:40]}"


def matches(want: str, got: str) -> bool:
    """Whether ``got`` is one of ``want`` (``unreachable``: any answer that is not an HTTP status)."""
    for option in want.split("|"):
        if option == UNREACHABLE and not got.isdigit():
            return True
        if option == got:
            return True
    return False


def main(argv: list[str]) -> int:
    """Probe every ``WANT METHOD URL`` argument; 1 if any answer is not the wanted one."""
    where = os.environ.get("PROBE_FROM") or socket.gethostname()
    failed = 0
    for spec in argv:
        want, method, url = spec.split(" ", 2)
        if method.startswith("POST:"):  # POST:<N>MiB[:chunked]
            size, _, framing = method[len("POST:"):].partition(":")
            got = post_body(url, int(size.removesuffix("MiB")) * 2**20, chunked=framing == "chunked")
        else:
            got = status(method, url)
        ok = matches(want, got)
        failed += not ok
        print(f"  [{where}] {method} {url} -> {got} (want {want}){'' if ok else '   <-- FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
