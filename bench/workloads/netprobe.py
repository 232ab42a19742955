#!/usr/bin/env python3
"""Point-to-point TCP throughput probe (client -> server), bounded in time. Stdlib only.

    netprobe.py server --bind ADDR --port P [--timeout 60] [--max-conns 1]
    netprobe.py client --connect ADDR --port P [--seconds 5] [--wait 0]

The server listens (port 0 = any free port), prints `SCALELAB_LISTEN {"address", "port"}` once
listening, then serves at most --max-conns connections one after another: it reads each until
the client half-closes and answers with the byte count it received (8 bytes, big-endian). It
exits after --max-conns connections or --timeout seconds, whichever comes first, printing
`SCALELAB_RESULT {"connections": [{"peer", "bytes", "seconds"}], ...}`.

The client sends zeros for --seconds, half-closes, waits for the server's count, and prints
`SCALELAB_RESULT {"mbit", "bytes", "seconds", ...}`, where bytes are what the server counted
(not what sat in the client's socket buffer), seconds run from connect to the server's
answer, and mbit = bytes * 8 / seconds / 1e6. A refused connection exits 2 with a clear error
(--wait S retries refusals for up to S seconds, for a server still starting).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit_result  # noqa: E402

CHUNK = 1 << 20
MAX_SECONDS = 3600.0
ACK = struct.Struct("!Q")


class ProbeError(Exception):
    """A netprobe failure with a one-line explanation."""


def mbit_per_s(nbytes: int, seconds: float) -> float:
    """Megabits (1e6 bits) per second.

    >>> mbit_per_s(125_000_000, 2.0)
    500.0
    """
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return nbytes * 8 / seconds / 1e6


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise ProbeError("connection closed before the server's byte count arrived")
        buf += part
    return buf


def serve(bind: str, port: int, timeout: float, max_conns: int) -> dict:
    deadline = time.monotonic() + timeout
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    conns = []
    with socket.socket(family, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind((bind, port))
        except OSError as e:
            raise ProbeError(f"cannot bind {bind}:{port}: {e.strerror or e}") from None
        srv.listen(max_conns)
        addr, real_port = srv.getsockname()[:2]
        sys.stdout.write(f'SCALELAB_LISTEN {{"address": "{addr}", "port": {real_port}}}\n')
        sys.stdout.flush()
        while len(conns) < max_conns:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            srv.settimeout(left)
            try:
                conn, peer = srv.accept()
            except TimeoutError:
                break
            with conn:
                t0 = time.monotonic()
                total = 0
                buf = bytearray(CHUNK)
                try:
                    while True:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise TimeoutError
                        conn.settimeout(left)
                        n = conn.recv_into(buf)
                        if n == 0:
                            break
                        total += n
                    conn.sendall(ACK.pack(total))
                    status = "ok"
                except TimeoutError:
                    status = "timeout"
                except OSError as e:
                    status = f"error: {e}"
                dt = time.monotonic() - t0
                conns.append({"peer": f"{peer[0]}:{peer[1]}", "bytes": total, "seconds": dt, "status": status})
                print(
                    f"netprobe: {peer[0]}:{peer[1]} sent {total} bytes in {dt:.3f} s ({status})",
                    file=sys.stderr,
                    flush=True,
                )
    return {"address": addr, "port": real_port, "connections": conns}


def client(host: str, port: int, seconds: float, wait: float) -> dict:
    deadline = time.monotonic() + wait
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise ProbeError(
                    f"connection to {host}:{port} refused: is 'netprobe.py server' running there?"
                ) from None
            time.sleep(0.1)
        except OSError as e:
            raise ProbeError(f"cannot connect to {host}:{port}: {e}") from None
    payload = memoryview(bytes(CHUNK))
    with sock:
        t0 = time.monotonic()
        end = t0 + seconds
        sent = 0
        sock.settimeout(max(10.0, seconds))
        try:
            while time.monotonic() < end:
                sock.sendall(payload)
                sent += CHUNK
            sock.shutdown(socket.SHUT_WR)
            (received,) = ACK.unpack(_recv_exact(sock, ACK.size))
        except TimeoutError:
            raise ProbeError(f"{host}:{port} stopped reading (timeout)") from None
        except OSError as e:
            raise ProbeError(f"transfer to {host}:{port} failed: {e}") from None
        dt = time.monotonic() - t0
    return {
        "mbit": mbit_per_s(received, dt),
        "bytes": received,
        "seconds": dt,
        "bytes_sent": sent,
        "peer": f"{host}:{port}",
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="point-to-point TCP throughput probe")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server", help="receive and count bytes")
    s.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    s.add_argument("--port", type=int, default=5201, help="TCP port (0: any free port)")
    s.add_argument("--timeout", type=float, default=60.0, help="exit after this many seconds")
    s.add_argument("--max-conns", type=int, default=1, help="connections to serve, then exit")
    c = sub.add_parser("client", help="send for a while and report throughput")
    c.add_argument("--connect", required=True, help="server address")
    c.add_argument("--port", type=int, default=5201, help="server TCP port")
    c.add_argument("--seconds", type=float, default=5.0, help="how long to send")
    c.add_argument("--wait", type=float, default=0.0, help="retry a refused connection for up to this many seconds")
    a = p.parse_args(argv)
    if a.mode == "server":
        if not 0 < a.timeout <= MAX_SECONDS or a.max_conns < 1:
            p.error(f"need 0 < --timeout <= {MAX_SECONDS:.0f} and --max-conns >= 1")
    elif not 0 < a.seconds <= MAX_SECONDS or not 0 <= a.wait <= MAX_SECONDS:
        p.error(f"need 0 < --seconds <= {MAX_SECONDS:.0f} and 0 <= --wait <= {MAX_SECONDS:.0f}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        if a.mode == "server":
            emit_result(serve(a.bind, a.port, a.timeout, a.max_conns))
        else:
            emit_result(client(a.connect, a.port, a.seconds, a.wait))
    except ProbeError as e:
        print(f"netprobe: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
