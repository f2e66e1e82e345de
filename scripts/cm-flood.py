#!/usr/bin/env python3
"""Hostile traffic for a RoCEv2 device's QP1, for checking by hand.

    scripts/cm-flood.py --to 127.0.0.66 --port 7466 [--from 127.0.0.99 ...]
                        [--count N] [--cm 0.25] [--only-req] [--seed S]

Sends --count datagrams to UDP port 4791 of --to, from sockets bound to
each --from address in turn. A fraction --cm of them are RoCEv2 UD
SEND_ONLY packets to QP1 with a right ICRC and the GSI Q_Key carrying a
CM MAD: a REQ whose service ID is rdma_cm's TCP port --port and whose
every other byte is random (the CMA header included), or a
DREQ/REJ/DREP/RTU/MRA with random comm IDs. The rest are random bytes.
--only-req sends nothing but such REQs. Every random choice comes from
--seed (printed).

The ICRC is the one a Linux UDP socket's datagram gets with IPv4
identification 0 and don't-fragment set, as roxe computes it (its
default ROXE_ICRC=warn accepts it). Standard library only; sends only
where it is told (use loopback addresses or a namespace of your own).
"""

import argparse
import random
import socket
import struct
import sys
import zlib

GSI_QKEY = 0x80010000
MGMT_CLASS_CM = 0x07
CM_CLASS_VERSION = 2
METHOD_SEND = 0x03
ATTR = {"REQ": 0x0010, "MRA": 0x0011, "REJ": 0x0012, "REP": 0x0013,
        "RTU": 0x0014, "DREQ": 0x0015, "DREP": 0x0016}
PS_TCP = 0x0106
UD_SEND_ONLY = 0x64


def icrc(src, dst, sport, dport, roce):
    """ICRC of `roce` (BTH onwards, without the ICRC) sent over IPv4."""
    total = 20 + 8 + len(roce) + 4
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0xFF, total, 0, 0x4000, 0xFF,
                     17, 0xFFFF, socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack("!HHHH", sport, dport, 8 + len(roce) + 4, 0xFFFF)
    bth = bytearray(roce)
    bth[4] = 0xFF  # FECN, BECN and resv6 are masked
    data = b"\xff" * 8 + ip + udp + bytes(bth)
    return struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def ud_to_qp1(mad, psn):
    pad = (-len(mad)) % 4
    bth = struct.pack("!BBHII", UD_SEND_ONLY, (pad << 4), 0xFFFF, 1,
                      0x80000000 | (psn & 0xFFFFFF))
    deth = struct.pack("!II", GSI_QKEY, 1)
    return bth + deth + mad + b"\0" * pad


def cm_mad(rng, attr, body):
    hdr = struct.pack("!BBBBHHQHHI", 1, MGMT_CLASS_CM, CM_CLASS_VERSION,
                      METHOD_SEND, 0, 0, rng.getrandbits(64), attr, 0, 0)
    return hdr + body


def forged_req(rng, port):
    body = bytearray(rng.randbytes(232))
    # Service ID at bytes 8..16 of the REQ: rdma_cm's TCP port space.
    body[8:16] = struct.pack("!Q", (PS_TCP << 16) | port)
    return cm_mad(rng, ATTR["REQ"], bytes(body))


def forged_other(rng):
    name = rng.choice(["DREQ", "REJ", "DREP", "RTU", "MRA"])
    body = rng.randbytes(232)
    return cm_mad(rng, ATTR[name], body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--to", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--from", dest="srcs", action="append", default=[])
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--cm", type=float, default=0.25)
    ap.add_argument("--only-req", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().getrandbits(32)
    print(f"cm-flood: seed {seed}", file=sys.stderr)
    rng = random.Random(seed)
    socks = []
    for s in a.srcs or ["127.0.0.99"]:
        k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        k.bind((s, 0))
        socks.append((s, k))
    cm_sent = 0
    for i in range(a.count):
        src, k = socks[i % len(socks)]
        if a.only_req or rng.random() < a.cm:
            mad = forged_req(rng, a.port) if a.only_req or rng.random() < 0.5 else forged_other(rng)
            roce = ud_to_qp1(mad, i)
            sport = k.getsockname()[1]
            pkt = roce + icrc(src, a.to, sport, 4791, roce)
            cm_sent += 1
        else:
            pkt = rng.randbytes(rng.randint(1, 300))
        try:
            k.sendto(pkt, (a.to, 4791))
        except OSError as e:
            print(f"cm-flood: send: {e}", file=sys.stderr)
    print(f"cm-flood: {a.count} datagrams, {cm_sent} CM MADs", file=sys.stderr)


if __name__ == "__main__":
    main()
