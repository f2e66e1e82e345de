#!/bin/bash
# The shared-address goals in one run (docs/PERFORMANCE.md), printed as
# lines "name result":
# - 8 pairs of `roxe perf write -s 65536` at once, every server on one
#   address and every client on another (shared), against the same 8 pairs
#   on 16 addresses of their own (ROXE_SHARE=off): aggregate GB/s and ratio;
# - `roxe perf send --lat -s 64` on shared addresses (3 more processes on
#   each, idle) against dedicated ones: median µs and ratio;
# - churn: N process starts and exits (ibv_devinfo over the drop-in, each
#   opening the device) on the server address of a validated stream
#   (ibv_rc_pingpong -c): the stream's result, and what its device counted.
# Needs: cargo build --release -p roxe-tools -p roxe-ibverbs; ibverbs-utils.
# Loopback addresses only.
#
#   scripts/shared-address.sh [--rounds N] [--churn N]
set -u
R=$(cd "$(dirname "$0")/.." && pwd)/target/release
L=$R/ibverbs
rounds=3 churn=1000
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --churn) churn=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--churn N]" >&2; exit 2 ;;
  esac
done
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# Aggregate GB/s of 8 write pairs; $1 = shared|dedicated.
pairs8() {
  local out; out=$(mktemp -d)
  for i in $(seq 0 7); do
    if [ "$1" = shared ]; then s=127.0.231.1 c=127.0.231.2 share=on
    else s=127.0.232.$((2 * i + 1)) c=127.0.232.$((2 * i + 2)) share=off; fi
    ROXE_SHARE=$share ROXE_ADDR=$s $R/roxe perf write -s 65536 -D 4 -p $((18720 + i)) --json server >/dev/null 2>&1 &
  done
  sleep 0.5
  for i in $(seq 0 7); do
    if [ "$1" = shared ]; then c=127.0.231.2 share=on; else c=127.0.232.$((2 * i + 2)) share=off; fi
    ROXE_SHARE=$share ROXE_ADDR=$c $R/roxe perf write -s 65536 -D 4 -p $((18720 + i)) --json client 127.0.0.1 >"$out/$i" 2>/dev/null &
  done
  wait
  cat "$out"/* | python3 -c 'import json,sys; print(round(sum(json.loads(l)["gbytes_per_s"] for l in sys.stdin if l.strip()), 3))'
  rm -r "$out"
}

# Median µs of a 64 B SEND ping-pong; $1 = shared|dedicated.
lat() {
  local s=127.0.233.1 c=127.0.233.2 share=off idle=()
  if [ "$1" = shared ]; then
    s=127.0.234.1 c=127.0.234.2 share=on
    # Three more processes on each address, connected and idle.
    for i in 0 1 2; do
      ROXE_ADDR=$s $R/roxe perf send --lat -n 100000000 -p $((18740 + i)) server >/dev/null 2>&1 & idle+=($!)
    done
    sleep 0.3
    for i in 0 1 2; do
      ROXE_ADDR=$c $R/roxe perf send -s 65536 -n 1 -D 30 -p $((18740 + i)) client 127.0.0.1 >/dev/null 2>&1 & idle+=($!)
    done
    sleep 0.5
    kill -STOP "${idle[@]}" 2>/dev/null
  fi
  ROXE_SHARE=$share ROXE_ADDR=$s $R/roxe perf send --lat -s 64 -n 20000 -p 18730 --json server >/dev/null 2>&1 &
  sleep 0.4
  ROXE_SHARE=$share ROXE_ADDR=$c $R/roxe perf send --lat -s 64 -n 20000 -p 18730 --json client 127.0.0.1 | json 'round(d["lat_us"]["p50"], 2)'
  wait $!
  if [ ${#idle[@]} -gt 0 ]; then kill -KILL "${idle[@]}" 2>/dev/null; wait 2>/dev/null; fi
}

for r in $(seq "$rounds"); do
  sh=$(pairs8 shared); de=$(pairs8 dedicated)
  ls=$(lat shared); ld=$(lat dedicated)
  echo "round $r: write8_shared $sh write8_dedicated $de lat64_shared $ls lat64_dedicated $ld"
  python3 -c "print('round $r: ratios write8 %.3f lat64 %.3f' % ($sh / $de, $ls / $ld))"
done

# Churn against a validated stream.
s=127.0.235.1 c=127.0.235.2
LD_LIBRARY_PATH=$L ROXE_ADDR=$s ibv_rc_pingpong -d roxe0 -g 0 -c -s 4096 -n 1000000000 -p 18750 >/tmp/churn-server.$$ 2>&1 &
server=$!
sleep 0.4
LD_LIBRARY_PATH=$L ROXE_ADDR=$c ibv_rc_pingpong -d roxe0 -g 0 -c -s 4096 -n 1000000000 -p 18750 127.0.0.1 >/tmp/churn-client.$$ 2>&1 &
client=$!
sleep 1
start=$(date +%s.%N) failed=0
for i in $(seq "$churn"); do
  LD_LIBRARY_PATH=$L ROXE_ADDR=$s ibv_devinfo -d roxe0 >/dev/null 2>&1 || failed=$((failed + 1))
done
end=$(date +%s.%N)
stat=$($R/roxe stat --json | python3 -c "
import json,sys
for d in json.load(sys.stdin)['devices']:
    if d['addr'] == '$s' and d['pid'] == $server:
        print('rx', d['rx_packets'], 'misrouted', d['rx_misrouted'], 'probe_rounds', d['steering_probes'], 'drops', d['drops'])")
alive=no; kill -0 $server 2>/dev/null && kill -0 $client 2>/dev/null && alive=yes
kill -TERM $server $client 2>/dev/null; wait 2>/dev/null
bad=$(grep -ci "invalid\|error\|failed" /tmp/churn-server.$$ /tmp/churn-client.$$ | awk -F: '{s+=$2} END {print s}')
python3 -c "print('churn: $churn starts and exits in %.1f s, $failed failed; stream alive $alive, error lines $bad; stream device: $stat' % ($end - $start))"
rm -f /tmp/churn-server.$$ /tmp/churn-client.$$
