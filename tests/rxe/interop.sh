#!/usr/bin/env bash
# Interop proof: `roxe pingpong` against rdma-core's ibv_rc_pingpong on the
# Linux kernel's Soft-RoCE (rdma_rxe), in a qemu guest of the rxe-peer harness.
#
#   sudo tests/rxe/interop.sh            # about 1-2 minutes; needs root
#
# Boots one guest (shared/rxe-peer/up 1) in its own network namespace, then
# for every case in CASES runs
#   - roxe as CLIENT (in the netns, bound to the bridge address) against
#     ibv_rc_pingpong as server in the guest, and
#   - roxe as SERVER against ibv_rc_pingpong as client in the guest,
# each with a tcpdump capture on the guest's tap, which must pass
# shared/tools/roce-check (every ICRC verified, rxe's and roxe's: the tap
# capture has the real IP headers) and must show every message of both
# directions on the wire. Always shuts the harness down. Exit status 0 only
# if every run passed; the last line is a one-line summary.
#
# Settings (environment):
#   CASES        "SIZE:ITERS ..." (default "1:1000 4096:1000 65536:200")
#   PMTU         path MTU for both sides (default 1024, rxe's active_mtu at
#                netdev MTU 1500)
#   OUT          directory for logs and captures (default: a new
#                /tmp/roxe-rxe-interop.XXXXXX, kept)
#   ROXE         roxe binary (default target/release/roxe; built if missing)
#   RXE_PEER     the harness (default ../shared/rxe-peer next to the repo)
#   ROCE_CHECK   the checker (default ../shared/tools/roce-check)
#   RXEPEER_NETNS netns of the harness (default roxeinterop, so a manual
#                rxe-peer session in netns rxepeer is left alone)
#   WAIT         seconds any single wait may take (default 60)
#   ROXE_FAULT   faults on roxe's transmit (loss=P,dup=P,reorder=P,seed=N):
#                loss recovery against rxe. Packets roxe lost never reach
#                the tap, so the captures' PSN checks only report then;
#                the programs' completions are the proof
#
# --c-programs [--libdir DIR]: instead of `roxe pingpong`, run rdma-core's and
# perftest's UNMODIFIED programs (/usr/bin/ibv_rc_pingpong, ibv_ud_pingpong,
# ib_write_bw, ...) in the netns over roxe's drop-in libibverbs.so.1
# (LD_LIBRARY_PATH=DIR, device roxe0, GID index 0) against the same program
# in the guest on rxe0, both roles, every run captured and roce-checked.
# rping and perftest `-R` connect through rdma_cm (the drop-in librdmacm.so.1
# in the same directory against the kernel's CM): their MADs on QP1 are in
# the captures too.
#   sudo tests/rxe/interop.sh --c-programs [--libdir /path/to/release/ibverbs]
# Settings of this mode (besides OUT, RXE_PEER, ROCE_CHECK, RXEPEER_NETNS, WAIT):
#   LIBDIR       dir holding roxe's libibverbs.so.1 (default: --libdir, else
#                target/release/ibverbs of this repo, built if missing)
#   C_CASES      ';'-separated "PROGRAM ARGS" (default: see c_cases_default)
#   RXEPEER_MTU  guest/bridge MTU (default 9000 in this mode: rxe's active_mtu
#                is then 4096, the active_mtu roxe reports, which perftest
#                uses by default and ibv_ud_pingpong's default 2048-byte
#                message needs)
#   ROXE_SIDE_PCAP=1  also write roxe's own ROXE_PCAP per run (diagnostics only)
set -uo pipefail

say() { printf '[interop %(%T)T] %s\n' -1 "$*" >&2; }
die() { say "ERROR: $*"; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
MODE=roxe
while [ $# -gt 0 ]; do
  case $1 in
    --c-programs) MODE=c ;;
    --libdir) [ $# -ge 2 ] || die "--libdir needs a directory"; LIBDIR=$2; shift ;;
    --libdir=*) LIBDIR=${1#*=} ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done
c_cases_default="ibv_rc_pingpong; ibv_rc_pingpong -s 1; ibv_rc_pingpong -s 65536 -m 1024;\
 ibv_ud_pingpong; ibv_ud_pingpong -s 1;\
 ib_write_bw -n 1000; ib_send_bw -n 1000; ib_read_bw -n 1000; ib_write_lat -n 1000;\
 rping -C 200 -V -v; ib_send_bw -R -n 1000"
if [ $MODE = c ]; then
  : "${C_CASES:=$c_cases_default}"
  : "${RXEPEER_MTU:=9000}"
  : "${ROXE_SIDE_PCAP:=0}"
  : "${C_TCPDUMP_OPTS:=--immediate-mode -B 262144}"
  export RXEPEER_MTU
fi
: "${CASES:=1:1000 4096:1000 65536:200}"
: "${PMTU:=1024}"
: "${ROXE:=$repo/target/release/roxe}"
: "${RXE_PEER:=$repo/../shared/rxe-peer}"
: "${ROCE_CHECK:=$repo/../shared/tools/roce-check}"
: "${RXEPEER_NETNS:=roxeinterop}"
: "${WAIT:=60}"
export RXEPEER_NETNS
OUT=${OUT:-$(mktemp -d /tmp/roxe-rxe-interop$([ $MODE = c ] && echo -c).XXXXXX)}
mkdir -p "$OUT"

[ "$(id -u)" = 0 ] || die "must run as root (netns, taps, qemu)"
[ -x "$RXE_PEER/up" ] || die "rxe-peer harness not found at $RXE_PEER (set RXE_PEER)"
[ -f "$ROCE_CHECK" ] || die "roce-check not found at $ROCE_CHECK (set ROCE_CHECK)"
command -v python3 >/dev/null || die "python3 is needed for roce-check"
if ! command -v tcpdump >/dev/null; then
  say "installing tcpdump"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tcpdump >/dev/null 2>&1 ||
    die "tcpdump is missing and apt-get install tcpdump failed"
fi
if [ $MODE = c ]; then
  if [ -z "${LIBDIR:-}" ]; then
    LIBDIR=$repo/target/release/ibverbs
    if [ ! -f "$LIBDIR/libibverbs.so.1" ]; then
      say "building roxe's libibverbs (cargo build --release -p roxe-ibverbs)"
      (cd "$repo" && cargo build --release -p roxe-ibverbs) >"$OUT/build.log" 2>&1 ||
        die "cargo build failed, see $OUT/build.log"
    fi
  fi
  LIBDIR=$(cd "$LIBDIR" 2>/dev/null && pwd) || die "--libdir: no such directory"
  [ -f "$LIBDIR/libibverbs.so.1" ] || die "no libibverbs.so.1 in $LIBDIR"
fi
# Both modes: `roxe decode` checks the captures' PSN order.
if [ ! -x "$ROXE" ]; then
  say "building roxe (cargo build --release -p roxe-tools)"
  (cd "$repo" && cargo build --release -p roxe-tools) >"$OUT/build.log" 2>&1 ||
    die "cargo build failed, see $OUT/build.log"
fi

# --- cleanup: always stop what we started and take the harness down --------
bg_pids=()
cleanup() {
  local rc=$?
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  "$RXE_PEER/down" >>"$OUT/harness.log" 2>&1 || say "WARNING: rxe-peer down failed (see $OUT/harness.log)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Wait (at most $2 seconds) until command $1... succeeds.
wait_for() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  until "$@"; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
}

# Stop a background process we started: TERM, bounded wait, KILL.
stop_pid() {
  local p=$1
  kill -TERM "$p" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$p" 2>/dev/null
  wait "$p" 2>/dev/null
}

# --- harness ----------------------------------------------------------------
say "booting 1 rxe guest (netns $RXEPEER_NETNS); output in $OUT"
"$RXE_PEER/down" >"$OUT/harness.log" 2>&1   # a stale run of this netns, if any
if ! timeout 600 "$RXE_PEER/up" 1 >>"$OUT/harness.log" 2>&1; then
  tail -20 "$OUT/harness.log" >&2
  die "rxe-peer up failed"
fi
eval "$("$RXE_PEER/status" --env)"
HOST_IP=$RXEPEER_HOST_IP GUEST_IP=$RXEPEER_G1_IP TAP=$RXEPEER_G1_TAP
GUEST_GIDX=${RXEPEER_G1_GID_INDEX:-1}
"$RXE_PEER/status" >>"$OUT/harness.log" 2>&1
say "host $HOST_IP (roxe, GID index 0), guest $GUEST_IP (rxe0, GID index $GUEST_GIDX), tap $TAP"
"$RXE_PEER/exec" 1 "ibv_devinfo -d rxe0 | grep -E 'state|active_mtu'" >"$OUT/guest-devinfo.txt" 2>&1

# --- one run ------------------------------------------------------------------
# result lines: "<bytes> bytes in <s> seconds = <x> Mbit/sec", "<n> iters in <s> seconds = <y> usec/iter"
iters_line() { grep -m1 -E '^[0-9]+ iters in .* usec/iter$' "$1"; }
mbit_line() { grep -m1 -E '^[0-9]+ bytes in .* Mbit/sec$' "$1"; }

# Check a capture: roce-check must pass (every ICRC verified, nothing
# malformed), and the request flows of both directions must span exactly
# ITERS messages of ceil(SIZE/PMTU) PSNs without gaps -- unless tcpdump
# itself reported drops (a capture artefact on a loaded host: then only a
# warning).
check_capture() { # pcap size iters tcpdump-drops -> prints a summary, returns 0/1
  python3 - "$ROCE_CHECK" "$1" "$2" "$3" "$4" "$PMTU" "$HOST_IP" "$GUEST_IP" "$ROXE" "${ROXE_FAULT:-}" <<'EOF'
import json, subprocess, sys
chk, pcap, size, iters, drops, pmtu, host, guest, roxe, fault = sys.argv[1:]
size, iters, drops, pmtu = int(size), int(iters), int(drops), int(pmtu)
r = subprocess.run([sys.executable, chk, "--json", pcap], capture_output=True, text=True)
try:
    f = json.loads(r.stdout)["files"][0]
except Exception:
    print(f"roce-check failed (exit {r.returncode}): {r.stderr.strip()[:300]}")
    sys.exit(1)
# roce-check calls any forward PSN jump after a retransmission a gap; a
# requester whose go-back is overtaken by the ACK jumps legally. PSNs only
# count as missing if some requester sent a PSN first before an older one
# it never sent (roxe decode's psn-skipped).
d = subprocess.run([roxe, "decode", "--json", pcap], capture_output=True, text=True)
try:
    skipped = json.loads(d.stdout)["files"][0]["warnings_by_kind"].get("psn-skipped", 0)
except Exception:
    print(f"roxe decode failed (exit {d.returncode}): {d.stderr.strip()[:300]}")
    sys.exit(1)
ok = r.returncode == 0 and f.get("result") == "PASS"
per_msg = max(1, -(-size // pmtu))
want = iters * per_msg
dirs = []
for src, dst in ((host, guest), (guest, host)):
    fl = [x for x in f["flows"] if x["src"] == src and x["dst"] == dst and x["kind"] == "req"]
    if len(fl) != 1:
        dirs.append(f"{src}>{dst}: {len(fl)} request flows"); ok = False; continue
    x = fl[0]
    span = ((x["last_psn"] - x["first_psn"]) & 0xFFFFFF) + 1
    good = span == want and (x["gaps"] == 0 or skipped == 0)
    ok &= good or drops > 0 or bool(fault)
    name = "roxe->rxe" if src == host else "rxe->roxe"
    short = "" if good else f" (want {want}, {x['missing_psns']} not captured)"
    if good and x["gaps"]:
        short = f" (go-back overtaken by an ACK {x['gaps']}x, no PSN skipped)"
    dirs.append(f"{name} {span} PSNs{short} retrans {x['retransmitted']}")
naks = sum(f["naks"].values()) if isinstance(f["naks"], dict) else f["naks"]
ic = f["icrc"]
print(f"roce-check {f['result']}: {f['rocev2_packets']} pkts, ICRC ok {ic['ok']} bad {ic['bad']} "
      f"unchecked {ic['unchecked']}, malformed {f['malformed']}, NAKs {naks}; " + "; ".join(dirs)
      + (f"; WARNING: tcpdump dropped {drops} packets, capture incomplete" if drops else "")
      + (f"; ROXE_FAULT={fault}: PSN checks report only" if fault else ""))
sys.exit(0 if ok else 1)
EOF
}

results=()
failures=0
warnings=0
port=18515
run_case() { # mode(client|server) size iters
  local mode=$1 size=$2 iters=$3
  local tag="roxe-$mode-s$size-n$iters"
  local pcap="$OUT/$tag.pcap" rlog="$OUT/$tag.roxe.txt" glog="$OUT/$tag.rxe.txt"
  port=$((port + 1))
  say "$tag: roxe $mode, size $size, $iters iters, port $port"

  "$RXE_PEER/ns" tcpdump -Z root -U --immediate-mode -B 65536 -i "$TAP" -w "$pcap" udp port 4791 2>"$OUT/$tag.tcpdump.txt" &
  local td=$!; bg_pids+=("$td")
  wait_for 15 grep -q 'listening on' "$OUT/$tag.tcpdump.txt" || say "WARNING: tcpdump not ready"

  local common=(-s "$size" -n "$iters" -m "$PMTU" -p "$port")
  local rcmd=(env ROXE_ADDR="$HOST_IP" ROXE_PCAP="$OUT/$tag.roxe-tap.pcap"
    timeout $((WAIT + 30)) "$RXE_PEER/ns" "$ROXE" pingpong -g 0 "${common[@]}" --timeout "$WAIT" --stats)
  # the rxe side outlives a stalled roxe side, for rxe_qp_state
  local gcmd="timeout $((WAIT + 20)) ibv_rc_pingpong -d rxe0 -g $GUEST_GIDX ${common[*]}"
  local rrc grc
  if [ "$mode" = client ]; then
    # rxe server first; roxe's client retries a refused connect until it listens.
    timeout $((WAIT + 30)) "$RXE_PEER/exec" 1 "$gcmd" >"$glog" 2>&1 &
    local gp=$!; bg_pids+=("$gp")
    "${rcmd[@]}" "$GUEST_IP" >"$rlog" 2>&1; rrc=$?
    [ $rrc = 0 ] || rxe_qp_state "$tag"
    wait "$gp"; grc=$?
  else
    "${rcmd[@]}" >"$rlog" 2>&1 &
    local rp=$!; bg_pids+=("$rp")
    if ! wait_for 15 sh -c "'$RXE_PEER/ns' ss -Hltn 'sport = :$port' | grep -q ."; then
      say "WARNING: roxe server not listening on $port after 15 s"
    fi
    timeout $((WAIT + 30)) "$RXE_PEER/exec" 1 "$gcmd $HOST_IP" >"$glog" 2>&1 &
    local gp=$!; bg_pids+=("$gp")
    wait "$rp"; rrc=$?
    [ $rrc = 0 ] || rxe_qp_state "$tag"
    wait "$gp"; grc=$?
  fi
  sleep 1     # let the last ACK reach the capture before tcpdump stops
  stop_pid "$td"

  local csum crc drops
  drops=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel.*/\1/p' "$OUT/$tag.tcpdump.txt")
  csum=$(check_capture "$pcap" "$size" "$iters" "${drops:-0}"); crc=$?
  local ri gi rm gm
  ri=$(iters_line "$rlog"); gi=$(iters_line "$glog"); rm=$(mbit_line "$rlog"); gm=$(mbit_line "$glog")
  local verdict=PASS
  if [ "$rrc" != 0 ] || [ "$grc" != 0 ] || [ $crc != 0 ] ||
     [ "${ri%% *}" != "$iters" ] || [ "${gi%% *}" != "$iters" ]; then
    verdict=FAIL; failures=$((failures + 1))
  fi
  {
    echo "== $verdict $tag (roxe exit $rrc, ibv_rc_pingpong exit $grc)"
    echo "   roxe pingpong  : ${ri:-<no result>} | ${rm:-}"
    echo "   ibv_rc_pingpong: ${gi:-<no result>} | ${gm:-}"
    echo "   $csum"
    grep -m1 'counters:' "$rlog" | sed 's/^/   /'
  } | tee -a "$OUT/summary.txt"
  if [ $verdict = FAIL ]; then
    echo "--- roxe output ($rlog):"; cat "$rlog"
    echo "--- ibv_rc_pingpong output ($glog):"; cat "$glog"
    echo "--- rxe hw_counters:"
    timeout 30 "$RXE_PEER/exec" 1 'cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *' 2>&1 | tr '\n' ' '; echo
    [ -f "$OUT/$tag.rxe-qp-state.txt" ] && { echo "--- rxe QPs while the rxe side still ran:"; cat "$OUT/$tag.rxe-qp-state.txt"; }
    echo "--- roce-check:"; python3 "$ROCE_CHECK" "$pcap" 2>&1 | tail -25
  fi
  case $csum in *WARNING*) warnings=$((warnings + 1)) ;; esac
  results+=("$verdict:$mode:$size:$iters")
  last_verdict=$verdict last_pcap=$pcap last_qpstate=$OUT/$tag.rxe-qp-state.txt
}

# --- --c-programs: rdma-core / perftest programs over roxe's libibverbs -------
# Capture check of one C-program run: roce-check must pass (every ICRC
# verified, none left unchecked, nothing malformed); for ibv_rc_pingpong
# (SPAN = PSNs per direction, 0 = skip) the request flows of both
# directions must also span exactly SPAN PSNs without gaps (only a warning
# when tcpdump reported drops). Prints a one-line summary incl. per-direction
# retransmissions (the roxe->rxe ones are roxe's tx retransmits).
check_capture_c() { # pcap span tcpdump-drops
  python3 - "$ROCE_CHECK" "$1" "$2" "$3" "$HOST_IP" "$GUEST_IP" "$ROXE" <<'PY'
import json, subprocess, sys
chk, pcap, span, drops, host, guest, roxe = sys.argv[1:]
span, drops = int(span), int(drops)
r = subprocess.run([sys.executable, chk, "--json", pcap], capture_output=True, text=True)
try:
    f = json.loads(r.stdout)["files"][0]
except Exception:
    print(f"roce-check failed (exit {r.returncode}): {r.stderr.strip()[:300]}")
    sys.exit(1)
# roce-check calls any forward PSN jump after a retransmission a gap; a
# requester whose go-back is overtaken by the ACK jumps legally. PSNs only
# count as missing if some requester sent a PSN first before an older one
# it never sent (roxe decode's psn-skipped).
d = subprocess.run([roxe, "decode", "--json", pcap], capture_output=True, text=True)
try:
    skipped = json.loads(d.stdout)["files"][0]["warnings_by_kind"].get("psn-skipped", 0)
except Exception:
    print(f"roxe decode failed (exit {d.returncode}): {d.stderr.strip()[:300]}")
    sys.exit(1)
ic = f["icrc"]
ok = r.returncode == 0 and f.get("result") == "PASS" and ic["unchecked"] == 0 and ic["bad"] == 0
dirs = []
for src, dst, name in ((host, guest, "roxe->rxe"), (guest, host, "rxe->roxe")):
    req = [x for x in f["flows"] if x["src"] == src and x["dst"] == dst and x["kind"] == "req"]
    if not req:
        dirs.append(f"{name}: no RC requests"); continue
    pk = sum(x["packets"] for x in req); rt = sum(x["retransmitted"] for x in req)
    gb = sum(x["go_back_events"] for x in req)
    s = f"{name}: {pk} req pkts, retrans {rt} ({gb} go-back)"
    if span:
        x = req[0]
        got = ((x["last_psn"] - x["first_psn"]) & 0xFFFFFF) + 1
        good = len(req) == 1 and got == span and (x["gaps"] == 0 or skipped == 0)
        ok &= good or drops > 0
        s += f", {got} PSNs" + ("" if good else f" (want {span}, {x['missing_psns']} not captured)")
        if good and x["gaps"]:
            s += f" (go-back overtaken by an ACK {x['gaps']}x, no PSN skipped)"
    dirs.append(s)
naks = sum(f["naks"].values()) if isinstance(f["naks"], dict) else f["naks"]
ops = f["opcodes"]; ud = sum(v for k, v in ops.items() if k.startswith("UD_"))
print(f"roce-check {f['result']}: {f['rocev2_packets']} pkts, ICRC ok {ic['ok']} bad {ic['bad']} "
      f"unchecked {ic['unchecked']}, malformed {f['malformed']}, NAKs {naks}"
      + (f", UD {ud}" if ud else "") + "; " + "; ".join(dirs)
      + (f"; WARNING: tcpdump dropped {drops} packets, capture incomplete" if drops else ""))
sys.exit(0 if ok else 1)
PY
}

# Linux 6.1 rxe's retry stall (tests/rxe/README.md, "Known rxe stall with 64 KiB
# ping-pong"):
# rxe's retransmit timer fires spuriously (it is never stopped once all is
# acknowledged), rxe starts resending a message roxe has already
# acknowledged in full, and its requester stops partway through that resend
# for good: while a WQE is being resent rxe's completer drops every
# response for it, so nothing roxe sends can end the stall. Signature, from
# the capture and the guest's QP table taken while rxe still ran: rxe's
# last request packets go back in PSN, its send queue PSN (sq-psn) stopped
# below the highest PSN it had sent, and roxe's last response to it
# acknowledges that highest PSN. Exit 0 if the run shows it.
rxe_retry_stall() { # pcap rxe-qp-state-file
  [ -f "$2" ] || return 1
  python3 - "$1" "$2" "$HOST_IP" "$GUEST_IP" <<'PY'
import re, struct, sys
pcap, qpfile, host, guest = sys.argv[1:]
m = re.search(r"type RC state RTS .*?sq-psn (\d+)", open(qpfile).read())
if not m:
    sys.exit(1)
sq = int(m.group(1))
data = open(pcap, "rb").read()
link = struct.unpack("<I", data[20:24])[0]
l2 = {1: 14, 113: 16, 101: 0}.get(link)
if l2 is None:
    sys.exit(1)
off, req, acks = 24, [], []
while off + 16 <= len(data):
    incl = struct.unpack("<I", data[off + 8:off + 12])[0]
    pkt = data[off + 16:off + 16 + incl]; off += 16 + incl
    ip = pkt[l2:]
    if len(ip) < 40 or ip[0] >> 4 != 4:
        continue
    ihl = (ip[0] & 15) * 4
    src, dst = ".".join(map(str, ip[12:16])), ".".join(map(str, ip[16:20]))
    bth = ip[ihl + 8:]
    if len(bth) < 12:
        continue
    op, psn = bth[0], struct.unpack(">I", bth[8:12])[0] & 0xFFFFFF
    if src == guest and dst == host and op < 0x0D:   # RC requests
        req.append(psn)
    elif src == host and dst == guest and op in (0x0D, 0x0F, 0x10, 0x11, 0x12):  # with an AETH
        acks.append(psn)
if len(req) < 2 or not acks:
    sys.exit(1)
d = lambda a, b: ((a - b + 0x800000) & 0xFFFFFF) - 0x800000   # a - b, mod 2^24
top = req[0]
for p in req:
    top = p if d(p, top) > 0 else top
went_back = d(req[-1], top) < 0
stopped_short = d(sq, top) <= 0 and d(sq, (req[-1] + 1) & 0xFFFFFF) == 0
sys.exit(0 if went_back and stopped_short and acks[-1] == top else 1)
PY
}

# perftest's result line: the line after the "#bytes #iterations ..." header
perftest_line() { awk '/#bytes/ { if (getline > 0) { $1 = $1; print; exit } }' "$1"; }
opt_val() { # opt default args... -> value of "-opt V" in args, else default
  local o=$1 d=$2; shift 2
  while [ $# -gt 0 ]; do [ "$1" = "$o" ] && [ $# -ge 2 ] && { echo "$2"; return; }; shift; done
  echo "$d"
}
rxe_counters() { # -> "name:value ..." of rxe0's hw_counters
  timeout 30 "$RXE_PEER/exec" 1 'cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *' 2>/dev/null | tr '\n' ' '
}
counters_delta() { # before after -> non-zero differences, "name +d"
  awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); for (i = 1; i <= n; i++) { split(x[i], kv, ":"); old[kv[1]] = kv[2] }
    n = split(b, y, " "); for (i = 1; i <= n; i++) { split(y[i], kv, ":"); d = kv[2] - old[kv[1]]; if (d) s = s " " kv[1] "+" d }
    print (s == "" ? " (none)" : s) }'
}

# After a failed roxe side, while the guest program still runs: rxe's QPs
# (sq-psn = next PSN its requester sends, rq-psn = next PSN it expects)
rxe_qp_state() {
  timeout 30 "$RXE_PEER/exec" 1 'rdma res show qp; cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *' \
    >"$OUT/$1.rxe-qp-state.txt" 2>&1
}
skipped=()
run_c_case() { # roxe-role(server|client) "PROGRAM ARGS"
  local role=$1 spec=$2
  local -a args; read -r -a args <<<"$spec"
  local prog=${args[0]}; args=("${args[@]:1}")
  local gflag kind
  case $prog in
    ibv_*_pingpong) kind=pp gflag=-g ;;
    rping) kind=cm ;;                       # rdma_cm: connects through CM MADs
    ib_*) kind=pt gflag=-x
          printf ' %s' "${args[@]}" | grep -qw -- -R && kind=ptcm ;;
    *) say "unknown program kind: $prog"; failures=$((failures + 1)); return ;;
  esac
  local argtag; argtag=$(printf '%s' "${args[*]}" | tr -d ' ')
  local tag="c-roxe-$role-$prog${argtag:+_$argtag}"
  [ -e "$OUT/$tag.pcap" ] && tag="${tag}_p$((port + 1))"   # a repeated case
  local pcap="$OUT/$tag.pcap" rlog="$OUT/$tag.roxe.txt" glog="$OUT/$tag.rxe.txt"
  port=$((port + 1))
  say "$tag: roxe ($prog over $LIBDIR) is $role, port $port"

  # ibv_rc_pingpong: both request flows span iters x ceil(size/mtu) PSNs
  local iters span=0
  iters=$(opt_val -n 1000 "${args[@]}")
  if [ "$prog" = ibv_rc_pingpong ]; then
    local size mtu
    size=$(opt_val -s 4096 "${args[@]}"); mtu=$(opt_val -m 1024 "${args[@]}")
    span=$((iters * ((size + mtu - 1) / mtu))); [ "$size" -gt 0 ] || span=$iters
  fi
  [ $kind = pt ] && ! printf ' %s' "${args[@]}" | grep -q ' -n ' && iters=""

  local before; before=$(rxe_counters)
  "$RXE_PEER/ns" nice -n -10 tcpdump -Z root $C_TCPDUMP_OPTS -i "$TAP" -w "$pcap" udp port 4791 2>"$OUT/$tag.tcpdump.txt" &
  local td=$!; bg_pids+=("$td")
  wait_for 15 grep -qs 'listening on' "$OUT/$tag.tcpdump.txt" || say "WARNING: tcpdump not ready"

  local renv=(LD_LIBRARY_PATH="$LIBDIR" ROXE_ADDR="$HOST_IP")
  [ "$ROXE_SIDE_PCAP" = 1 ] && renv+=(ROXE_PCAP="$OUT/$tag.roxe-side.pcap")
  # What each side runs; the client's last argument is the server address
  # (rping names it with -a on both sides instead).
  local -a rprog gprog
  local rsrv="$GUEST_IP" gsrv="$HOST_IP"
  case $kind in
    cm)
      local sa="$HOST_IP"; [ "$role" = client ] && sa="$GUEST_IP"
      if [ "$role" = server ]; then rprog=(-s) gprog=(-c); else rprog=(-c) gprog=(-s); fi
      rprog=(/usr/bin/rping "${rprog[@]}" -a "$sa" -p "$port" "${args[@]}")
      gprog=(rping "${gprog[@]}" -a "$sa" -p "$port" "${args[@]}")
      rsrv="" gsrv="" ;;
    ptcm)
      rprog=("/usr/bin/$prog" -d roxe0 -p "$port" "${args[@]}")
      gprog=("$prog" -d rxe0 -p "$port" "${args[@]}") ;;
    *)
      rprog=("/usr/bin/$prog" -d roxe0 "$gflag" 0 -p "$port" "${args[@]}")
      gprog=("$prog" -d rxe0 "$gflag" "$GUEST_GIDX" -p "$port" "${args[@]}") ;;
  esac
  local rcmd=(timeout $((WAIT + 30)) "$RXE_PEER/ns" env "${renv[@]}" timeout "$WAIT" "${rprog[@]}")
  local gcmd="timeout $((WAIT + 20)) ${gprog[*]}"
  local rrc grc
  if [ "$role" = client ]; then
    # rxe server first; rdma-core/perftest clients do not retry a refused
    # connect: wait for its TCP listener, or (rdma_cm) its listening cm_id
    timeout $((WAIT + 30)) "$RXE_PEER/exec" 1 "$gcmd" >"$glog" 2>&1 &
    local gp=$!; bg_pids+=("$gp")
    local ready="ss -Hltn \"sport = :$port\" | grep -q ."
    case $kind in cm|ptcm) ready="rdma res show cm_id 2>/dev/null | grep LISTEN | grep -q :$port" ;; esac
    timeout 40 "$RXE_PEER/exec" 1 "timeout 30 sh -c 'until $ready; do sleep 0.2; done'" >/dev/null 2>&1 ||
      say "WARNING: $prog in the guest not listening on $port after 30 s"
    "${rcmd[@]}" $rsrv >"$rlog" 2>&1; rrc=$?
    [ $rrc = 0 ] || rxe_qp_state "$tag"
    wait "$gp"; grc=$?
  else
    "${rcmd[@]}" >"$rlog" 2>&1 &
    local rp=$!; bg_pids+=("$rp")
    case $kind in
      cm|ptcm) sleep 3 ;;   # roxe's listen is not visible to ss: give it time
      *) if ! wait_for 15 sh -c "'$RXE_PEER/ns' ss -Hltn 'sport = :$port' | grep -q ."; then
           say "WARNING: $prog over roxe not listening on $port after 15 s"
         fi ;;
    esac
    timeout $((WAIT + 50)) "$RXE_PEER/exec" 1 "$gcmd $gsrv" >"$glog" 2>&1 &
    local gp=$!; bg_pids+=("$gp")
    wait "$rp"; rrc=$?
    [ $rrc = 0 ] || rxe_qp_state "$tag"
    wait "$gp"; grc=$?
  fi
  sleep 1     # let the last ACK reach the capture before tcpdump stops
  stop_pid "$td"
  local after; after=$(rxe_counters)

  local csum crc drops
  drops=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel.*/\1/p' "$OUT/$tag.tcpdump.txt")
  csum=$(check_capture_c "$pcap" "$span" "${drops:-0}"); crc=$?
  local rres gres rok=1 gok=1
  if [ $kind = cm ]; then  # rping -v prints each ping on the client side
    local want; want=$(opt_val -C 0 "${args[@]}")
    rres="$(grep -c 'ping data: rdma-ping-' "$rlog") pings"; gres="$(grep -c 'ping data: rdma-ping-' "$glog") pings"
    local cres=$rres; [ "$role" = server ] && cres=$gres
    [ "${cres%% *}" = "$want" ] || { rok=0; gok=0; }
  elif [ $kind = pp ]; then
    rres=$(iters_line "$rlog"); gres=$(iters_line "$glog")
    [ "${rres%% *}" = "$iters" ] || rok=0; [ "${gres%% *}" = "$iters" ] || gok=0
    rres="${rres:-<no result>} | $(mbit_line "$rlog")"; gres="${gres:-<no result>} | $(mbit_line "$glog")"
  else  # "#bytes #iterations ...": the iteration count must be ours
    rres=$(perftest_line "$rlog"); gres=$(perftest_line "$glog")
    set -- $rres; [ -n "$rres" ] && [ -z "$iters" -o "${2:-}" = "$iters" ] || rok=0
    set -- $gres; [ -n "$gres" ] && [ -z "$iters" -o "${2:-}" = "$iters" ] || gok=0
    rres=${rres:-<no result>} gres=${gres:-<no result>}
  fi
  local verdict=PASS
  if [ "$rrc" != 0 ] || [ "$grc" != 0 ] || [ $crc != 0 ] || [ $rok = 0 ] || [ $gok = 0 ]; then
    verdict=FAIL; failures=$((failures + 1))
  fi
  {
    echo "== $verdict $tag (roxe side exit $rrc, rxe side exit $grc)"
    echo "   roxe: ${rres}"
    echo "   rxe : ${gres}"
    echo "   $csum"
    echo "   rxe hw_counters delta:$(counters_delta "$before" "$after")"
  } | tee -a "$OUT/summary.txt"
  if [ $verdict = FAIL ]; then
    echo "--- roxe side output ($rlog):"; cat "$rlog"
    echo "--- rxe side output ($glog):"; cat "$glog"
    echo "--- rxe hw_counters: $after"
    [ -f "$OUT/$tag.rxe-qp-state.txt" ] && { echo "--- rxe QPs while the rxe side still ran:"; cat "$OUT/$tag.rxe-qp-state.txt"; }
    echo "--- roce-check:"; python3 "$ROCE_CHECK" "$pcap" 2>&1 | tail -25
  fi
  case $csum in *WARNING*) warnings=$((warnings + 1)) ;; esac
  results+=("$verdict:$role:$spec")
  last_verdict=$verdict last_rlog=$rlog last_glog=$glog last_pcap=$pcap
  last_qpstate=$OUT/$tag.rxe-qp-state.txt
}

# After a failed run (last_*): whether it ended in rxe's retry stall and
# may be repeated (at most 3 per script run); if so it is logged and taken
# out of the results.
repeat_after_rxe_stall() { # what
  [ "$last_verdict" = FAIL ] && [ "$rxe_stalls" -lt 3 ] &&
    rxe_retry_stall "$last_pcap" "$last_qpstate" || return 1
  rxe_stalls=$((rxe_stalls + 1))
  say "$1: rxe's requester stalled in a spurious resend of an acknowledged message (rxe 6.1 retry stall); again"
  echo "   (the run above is repeated: rxe's retry stall, see tests/rxe/README.md)" >>"$OUT/summary.txt"
  failures=$((failures - 1)); unset 'results[-1]'
}

# perftest 4.5-0.17's -R client connects its test QP right after the
# control exchange; a REQ that beats the server's rdma_listen is rejected
# (reason 8, by the kernel's CM as by roxe's) and that perftest's retry then
# reuses ids it destroyed and crashes (fixed upstream). Such a run is
# repeated (at most 10 times: on 2026-11-26 the roxe client's REQ beat the
# guest's listen in 5 of 9 attempts, and on 2026-11-28 in 5 of 5 of one
# case), logged; any other failure counts.
run_c_case_retrying() { # role spec
  local attempt
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    run_c_case "$1" "$2"
    if [ "$last_verdict" = FAIL ] && [ $attempt -lt 10 ] &&
      printf ' %s' $2 | grep -qw -- -R &&
      grep -qs 'RDMA_CM_EVENT_REJECTED; error: 8' "$last_rlog" "$last_glog"; then
      say "$2 ($1): perftest's REQ came before the listen (perftest 4.5-0.17 -R race); again"
      echo "   (the run above is repeated: perftest -R REQ-before-listen race)" >>"$OUT/summary.txt"
      failures=$((failures - 1)); unset 'results[-1]'
      continue
    fi
    if [ "$last_verdict" = FAIL ] && [ $attempt -lt 10 ] &&
      grep -qs "Can't produce a report" "$last_rlog" "$last_glog"; then
      # perftest measures the CPU's cycles against the clock before its
      # report and refuses one when they do not correlate (r^2 < 0.9):
      # in the emulated guest, under load, after a complete transfer.
      say "$2 ($1): perftest could not time the CPU (no report); again"
      echo "   (the run above is repeated: perftest's CPU-frequency check failed)" >>"$OUT/summary.txt"
      failures=$((failures - 1)); unset 'results[-1]'
      continue
    fi
    if [ $attempt -lt 10 ] && repeat_after_rxe_stall "$2 ($1)"; then
      continue
    fi
    return
  done
}
rxe_stalls=0

if [ $MODE = c ]; then
  {
    echo "# roxe's library: $LIBDIR"
    "$RXE_PEER/ns" env LD_LIBRARY_PATH="$LIBDIR" ROXE_ADDR="$HOST_IP" ldd /usr/bin/ibv_rc_pingpong | grep libibverbs
    "$RXE_PEER/ns" env LD_LIBRARY_PATH="$LIBDIR" ROXE_ADDR="$HOST_IP" timeout 30 ibv_devinfo -d roxe0 2>&1 | grep -E 'hca_id|state|mtu'
    "$RXE_PEER/ns" env LD_LIBRARY_PATH="$LIBDIR" ROXE_ADDR="$HOST_IP" timeout 30 ibv_devinfo -d roxe0 -v 2>&1 | grep -A1 -m1 'GID\[ *0\]'
  } >"$OUT/roxe-devinfo.txt" 2>&1
  grep -q "$LIBDIR" "$OUT/roxe-devinfo.txt" || die "ldd does not resolve libibverbs.so.1 to $LIBDIR (see $OUT/roxe-devinfo.txt)"
  IFS=';' read -r -a c_cases <<<"$C_CASES"
  for spec in "${c_cases[@]}"; do
    spec=$(echo $spec)                       # trim
    [ -n "$spec" ] || continue
    prog=${spec%% *}
    if [ ! -x "/usr/bin/$prog" ] || ! timeout 30 "$RXE_PEER/exec" 1 "command -v $prog" >/dev/null 2>&1; then
      say "SKIP $spec: $prog missing on the host or in the guest"; skipped+=("$spec"); continue
    fi
    run_c_case_retrying server "$spec"
    run_c_case_retrying client "$spec"
  done
  n=${#results[@]}
  summary="roxe libibverbs<->rxe interop (unmodified rdma-core/perftest programs): $([ $failures = 0 ] && [ $n -gt 0 ] && echo PASS || echo FAIL) $((n - failures))/$n runs (roxe server+client x ${#c_cases[@]} cases, guest MTU $RXEPEER_MTU), tcpdump captures roce-checked$([ $warnings = 0 ] || echo " ($warnings incomplete)")$([ $rxe_stalls = 0 ] || echo "; $rxe_stalls run(s) repeated after rxe's retry stall")$([ ${#skipped[@]} = 0 ] || echo "; skipped: ${skipped[*]}"); logs in $OUT"
  echo "$summary" | tee -a "$OUT/summary.txt"
  [ $failures = 0 ] && [ $n -gt 0 ]
  exit
fi

# A run that ends in rxe's retry stall (see rxe_retry_stall) is repeated,
# at most 3 times per script run, each logged; any other failure counts.
run_case_retrying() { # mode size iters
  local attempt
  for attempt in 1 2 3 4; do
    run_case "$@"
    if [ $attempt -lt 4 ] && repeat_after_rxe_stall "roxe $1, size $2"; then
      continue
    fi
    return
  done
}

for c in $CASES; do
  run_case_retrying client "${c%%:*}" "${c##*:}"
  run_case_retrying server "${c%%:*}" "${c##*:}"
done

n=${#results[@]}
summary="roxe<->rxe interop: $([ $failures = 0 ] && echo PASS || echo FAIL) $((n - failures))/$n runs (roxe client+server x size:iters ${CASES// /,}, pmtu $PMTU${ROXE_FAULT:+, roxe under ROXE_FAULT=$ROXE_FAULT}), tcpdump captures roce-checked$([ $warnings = 0 ] || echo " ($warnings incomplete)")$([ $rxe_stalls = 0 ] || echo "; $rxe_stalls run(s) repeated after rxe's retry stall"); logs in $OUT"
echo "$summary" | tee -a "$OUT/summary.txt"
[ $failures = 0 ]
