#!/bin/bash
# Goodput against message size on loopback: `roxe perf write|read|send`
# beside iperf3 TCP with the same write size, and the CPU time each run
# took on both sides (user + system, of both processes) per GB moved.
# Prints one line per size and operation and writes a CSV and an SVG
# (scripts/plot-sweep.py) next to each other.
#
# usage: scripts/size-sweep.sh [-o PREFIX] [-D SECONDS] [SIZE...]
#   -o PREFIX   output files PREFIX.csv and PREFIX.svg (default: size-sweep)
#   -D SECONDS  length of each run (default 2)
#   SIZE...     message sizes in bytes (default 64 B to 1 MiB, powers of 4)
# Needs: cargo build --release -p roxe-tools; iperf3; python3. Loopback
# addresses only.
set -eu
R=$(cd "$(dirname "$0")/.." && pwd)/target/release
prefix=size-sweep
secs=2
while getopts "o:D:" opt; do
  case $opt in
    o) prefix=$OPTARG ;;
    D) secs=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
sizes=${*:-64 256 1024 4096 16384 65536 262144 1048576}
[ -x "$R/roxe" ] || { echo "size-sweep: build first: cargo build --release -p roxe-tools" >&2; exit 2; }
command -v iperf3 >/dev/null || { echo "size-sweep: iperf3 is not installed" >&2; exit 2; }
csv=$prefix.csv
echo "op,size,gbytes_per_s,cpu_s_per_gb" > "$csv"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# CPU seconds (user + system) GNU time wrote to file $1.
cpu() { awk '{s += $1 + $2} END {print s + 0}' "$1"; }

for s in $sizes; do
  for op in write read send; do
    /usr/bin/time -f "%U %S" -o "$tmp/srv" \
      env ROXE_ADDR=127.0.224.1 "$R/roxe" perf $op -s "$s" -D "$secs" -p 18720 --json server >/dev/null 2>&1 &
    sleep 0.4
    /usr/bin/time -f "%U %S" -o "$tmp/cli" \
      env ROXE_ADDR=127.0.224.2 "$R/roxe" perf $op -s "$s" -D "$secs" -p 18720 --json client 127.0.0.1 > "$tmp/out" 2>/dev/null
    wait
    gbps=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["gbytes_per_s"])' "$tmp/out")
    bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$tmp/out")
    c=$(python3 -c "print(($(cpu "$tmp/srv") + $(cpu "$tmp/cli")) / ($bytes / 1e9))")
    printf '%-6s %8s B  %7.3f GB/s  %6.2f CPU s/GB\n' "$op" "$s" "$gbps" "$c"
    echo "$op,$s,$gbps,$c" >> "$csv"
  done
  /usr/bin/time -f "%U %S" -o "$tmp/srv" iperf3 -s -1 -p 5310 >/dev/null 2>&1 &
  sleep 0.3
  /usr/bin/time -f "%U %S" -o "$tmp/cli" iperf3 -c 127.0.0.1 -p 5310 -l "$s" -t "$secs" -J > "$tmp/out"
  wait
  read -r gbps bytes < <(python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["end"]["sum_received"]; print(e["bits_per_second"]/8e9, e["bytes"])' "$tmp/out")
  c=$(python3 -c "print(($(cpu "$tmp/srv") + $(cpu "$tmp/cli")) / ($bytes / 1e9))")
  printf '%-6s %8s B  %7.3f GB/s  %6.2f CPU s/GB\n' tcp "$s" "$gbps" "$c"
  echo "tcp,$s,$gbps,$c" >> "$csv"
done
python3 "$(dirname "$0")/plot-sweep.py" "$csv" "$prefix.svg"
echo "wrote $csv and $prefix.svg"
