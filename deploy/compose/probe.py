"""Reachability probes of `make compose-check` (deploy/compose/check.sh), run wherever a probe must come
from: inside a container of the stack (``docker exec -i CID python - ARGS < probe.py``), on the host, and
in a second network namespace routed through the host (``ip netns exec NS python3 probe.py ARGS``).

Each argument is ``"WANT METHOD URL"``: WANT is an HTTP status, a ``|``-list of them, or ``unreachable``
(no such name, connection refused, no route, timeout: nothing answered). TLS is not verified here (a
probe by IP address must still see the proxy's answer); what is checked is who answers at all, and with
what. Prints one line per probe, prefixed with ``PROBE_FROM``; exits 1 if any answer is not the wanted one.
Standard library only (the images and the host have no fedpers).
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
        got = status(method, url)
        ok = matches(want, got)
        failed += not ok
        print(f"  [{where}] {method} {url} -> {got} (want {want}){'' if ok else '   <-- FAILED'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
