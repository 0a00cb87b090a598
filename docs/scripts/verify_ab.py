"""Ed25519 verify of a 600-byte message (an announcement's size): pyca/cryptography against
``protocol.identity.verify`` (libsodium), alternating, 7 repeats of 2,000 calls; medians in µs.

Run: ``.venv/bin/python docs/scripts/verify_ab.py``
"""

from __future__ import annotations

import statistics
import timeit

from distronet.protocol.identity import Identity, public_key_from_peer_id, verify


def main() -> None:
    ident = Identity.generate()
    msg = b"x" * 600
    sig = ident.sign(msg)
    key = ident.peer_id

    def openssl() -> None:
        public_key_from_peer_id(key).verify(sig, msg)

    def sodium() -> None:
        assert verify(key, msg, sig)

    a: list[float] = []
    b: list[float] = []
    for _ in range(7):
        a.append(timeit.timeit(openssl, number=2000) / 2000 * 1e6)
        b.append(timeit.timeit(sodium, number=2000) / 2000 * 1e6)
    print(f"cryptography {statistics.median(a):.1f} us, libsodium {statistics.median(b):.1f} us")


if __name__ == "__main__":
    main()
