#!/usr/bin/env bash
# Many processes on one address, across hosts: this host's roxe processes
# all on the harness bridge's one address, each talking to its own process
# on the kernel's rxe in a qemu guest of the rxe-peer harness (which shares
# the guest's one address natively), all at once:
#   - N ibv_rc_pingpong pairs (validated buffers), roxe servers here;
#   - N ibv_rc_pingpong pairs, roxe clients here;
#   - N ib_send_lat pairs, roxe servers here (not ib_write_bw: four at
#     once against rxe under emulation, some fail perftest's closing TCP
#     exchange after all their data was acknowledged, with dedicated
#     addresses and ROXE_SHARE=off too);
#   - N rping pairs through rdma_cm (the kernel's CM in the guest), roxe
#     servers here, each on its own port;
# every run captured on the guest's tap and checked by roce-check (the
# probes roxe's processes send each other are well-formed UD SENDs to QP0).
#
#   sudo tests/rxe/shared_address.sh        # needs root and qemu
#
# Settings: N (default 4), LIBDIR (the drop-in, default
# target/release/ibverbs, built if missing), RXE_PEER (default
# ../shared/rxe-peer), ROCE_CHECK (default ../shared/tools/roce-check),
# RXEPEER_NETNS (default roxeshared), OUT (logs; default a new
# /tmp/roxe-rxe-shared.XXXXXX, kept), WAIT (seconds per run, 120).
set -uo pipefail

say() { printf '[shared %(%T)T] %s\n' -1 "$*" >&2; }
die() { say "ERROR: $*"; exit 2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
RXE_PEER=${RXE_PEER:-$repo/../shared/rxe-peer}
ROCE_CHECK=${ROCE_CHECK:-$repo/../shared/tools/roce-check}
export RXEPEER_NETNS=${RXEPEER_NETNS:-roxeshared}
N=${N:-4}
WAIT=${WAIT:-120}
OUT=${OUT:-$(mktemp -d /tmp/roxe-rxe-shared.XXXXXX)}
LIBDIR=${LIBDIR:-$repo/target/release/ibverbs}
[ "$(id -u)" = 0 ] || die "needs root (the harness boots qemu in a network namespace)"
[ -x "$RXE_PEER/up" ] || die "no rxe-peer harness at $RXE_PEER"
if [ ! -f "$LIBDIR/libibverbs.so.1" ]; then
  say "building the drop-in (release)"
  (cd "$repo" && cargo build -q --release -p roxe-ibverbs) || die "build failed"
fi

if ! command -v tcpdump >/dev/null; then
  say "installing tcpdump"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tcpdump >/dev/null 2>&1 || die "no tcpdump"
fi

cleanup() { "$RXE_PEER/down" >/dev/null 2>&1; }
trap cleanup EXIT
trap 'exit 130' INT TERM

say "booting a guest (netns $RXEPEER_NETNS; logs in $OUT)"
"$RXE_PEER/up" 1 >"$OUT/up.log" 2>&1 || { cat "$OUT/up.log"; die "the guest did not boot"; }
host=${RXEPEER_NET:-10.47.91}.1
guest=${RXEPEER_NET:-10.47.91}.11
G() { "$RXE_PEER/exec" 1 "$@"; }
NS() { "$RXE_PEER/ns" "$@"; }
# Every roxe process here: the drop-in, the one bridge address, GID 0.
H() { NS env LD_LIBRARY_PATH="$LIBDIR" ROXE_ADDR="$host" timeout "$WAIT" "$@"; }

pass=0; fail=0; results=()
record() { # name status detail
  if [ "$2" = 0 ]; then pass=$((pass+1)); results+=("PASS $1: $3"); say "PASS $1: $3"
  else fail=$((fail+1)); results+=("FAIL $1: $3"); say "FAIL $1: $3"; fi
}

capture() { # name -> starts tcpdump on the guest's tap; echo its pid
  NS tcpdump -i rxetap1 -U -w "$OUT/$1.pcap" udp port 4791 >/dev/null 2>&1 &
  echo $!
}
checked() { # name pid -> 0 if the capture passes roce-check
  sleep 1; kill "$2" 2>/dev/null; wait "$2" 2>/dev/null
  # Not --strict: under emulation the host drops some of four streams'
  # packets, and rxe's go-back-N resumes inside a message, which the
  # checker's message-length accounting warns about.
  python3 "$ROCE_CHECK" "$OUT/$1.pcap" >"$OUT/$1.check" 2>&1
}

# $1 name, $2 "here|guest" (which side serves), $3 program, $4 its GID
# index flag (-g or -x), $5 args: N pairs at once, each on its own port.
pairs() {
  local name=$1 serves=$2 prog=$3 gflag=$4 args=$5 i rc=0 cap
  cap=$(capture "$name")
  for i in $(seq "$N"); do
    local port=$((19000 + i))
    if [ "$serves" = here ]; then
      H $prog -d roxe0 $gflag 0 $args -p $port >"$OUT/$name-s$i.log" 2>&1 &
    else
      G "timeout $WAIT $prog -d rxe0 $gflag $GIDX $args -p $port" >"$OUT/$name-s$i.log" 2>&1 &
    fi
  done
  sleep 3
  local clients=()
  for i in $(seq "$N"); do
    local port=$((19000 + i))
    if [ "$serves" = here ]; then
      G "timeout $WAIT $prog -d rxe0 $gflag $GIDX $args -p $port $host" >"$OUT/$name-c$i.log" 2>&1 &
    else
      H $prog -d roxe0 $gflag 0 $args -p $port "$guest" >"$OUT/$name-c$i.log" 2>&1 &
    fi
    clients+=($!)
  done
  for j in $(jobs -p); do [ "$j" = "$cap" ] && continue; wait "$j" || rc=1; done
  checked "$name" "$cap" || rc=1
  record "$name" $rc "$N pairs, $(grep -h -c 'iters in\|t_avg' "$OUT/$name"-c*.log | paste -sd+ | bc) result lines; $(tail -1 "$OUT/$name.check")"
}

# rxe lists the IPv6 link-local GID first: its IPv4 RoCEv2 GID is index 1.
GIDX=${RXEPEER_G1_GID_INDEX:-1}
pp_args="-c -n 500 -s 4096"
pairs rc_pingpong_roxe_serves here ibv_rc_pingpong -g "$pp_args"
pairs rc_pingpong_rxe_serves guest ibv_rc_pingpong -g "$pp_args"
pairs ib_send_lat_roxe_serves here ib_send_lat -x "-s 64 -n 500"

# rping: N roxe servers on one address, one port each; rxe clients.
cap=$(capture rping)
for i in $(seq "$N"); do
  H rping -s -a "$host" -p $((19100 + i)) -C 100 -V >"$OUT/rping-s$i.log" 2>&1 &
done
sleep 3
for i in $(seq "$N"); do
  G "timeout $WAIT rping -c -a $host -p $((19100 + i)) -C 100 -V -v" >"$OUT/rping-c$i.log" 2>&1 &
done
rc=0
for j in $(jobs -p); do [ "$j" = "$cap" ] && continue; wait "$j" || rc=1; done
checked rping "$cap" || rc=1
pings=$(cat "$OUT"/rping-c*.log | grep -c "ping data: rdma-ping-")
[ "$pings" = $((100 * N)) ] || rc=1
record rping_roxe_serves $rc "$pings pings verified by $N clients; $(tail -1 "$OUT/rping.check")"

printf '%s\n' "${results[@]}" >"$OUT/summary.txt"
echo "many processes on one address across hosts: $([ $fail = 0 ] && echo PASS || echo FAIL) $pass/$((pass+fail)) runs ($N roxe processes on $host against the guest's rxe)"
[ "$fail" = 0 ]
