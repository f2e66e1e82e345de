#!/bin/bash
# Issue 29's speed goals, measured as same-minute ratios, in interleaved
# rounds (a VM whose speed drifts makes ratios of figures measured minutes
# apart meaningless):
#   put_bw   UCT `put_bw -D zcopy -s 65536` over rc_verbs / `roxe perf write
#            -s 65536` (goal >= 0.9)
#   tag_lat  UCP `tag_lat -s 8` p50 (UCX_TLS=rc,self) / `roxe perf send
#            --lat -s 8` p50 (goal <= 1.2)
#   mpi      MPI 1 MiB ping-pong (tests/c/mpi_check.c), the time per round
#            trip over Open MPI's TCP transport / over pml ucx on roxe
#            (goal >= 1.0)
# One line per round, then each ratio's median over the rounds.
#
#   scripts/compare-middleware.sh [--rounds N]     (default 3)
#
# Needs: cargo build --release -p roxe-tools -p roxe-ibverbs; Debian's
# ucx-utils, openmpi-bin and libopenmpi-dev. Loopback addresses only.
set -u
n=3
[ "${1:-}" = --rounds ] && n=${2:?--rounds needs a count}
repo=$(cd "$(dirname "$0")/.." && pwd)
R=$repo/target/release/roxe
for p in ucx_perftest mpirun mpicc; do
  command -v "$p" >/dev/null || { echo "compare-middleware: $p not found (ucx-utils, openmpi-bin, libopenmpi-dev)" >&2; exit 2; }
done
[ -x "$R" ] || { echo "compare-middleware: build first: cargo build --release -p roxe-tools -p roxe-ibverbs" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_check" "$repo/tests/c/mpi_check.c" || exit 2
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)

field() { # the field after "Final:" + $1 in a ucx_perftest output file
  awk -v k="$1" '{for (i = 1; i <= NF; i++) if ($i == "Final:") print $(i + k)}' "$2" | head -1
}

ucx_pair() { # test, extra args...: server then client, both over roxe
  local t=$1; shift
  UCX_TLS=${TLS:-rc,self} $R run -q --roxe-addr 127.0.231.1 -- ucx_perftest -t "$t" -p 18720 "$@" >"$work/s.out" 2>&1 &
  sleep 1
  UCX_TLS=${TLS:-rc,self} timeout 60 $R run -q --roxe-addr 127.0.231.2 -- ucx_perftest 127.0.0.1 -t "$t" -p 18720 "$@" >"$work/c.out" 2>&1
  wait
}

roxe_perf() { # args... -> the client's JSON
  ROXE_ADDR=127.0.231.3 $R perf "$@" -p 18721 server >/dev/null 2>&1 &
  sleep 0.4
  ROXE_ADDR=127.0.231.4 timeout 60 $R perf "$@" -p 18721 --json 127.0.231.3
  wait
}

mpi_rt() { # mpirun args... -> microseconds per round trip
  timeout 120 "$@" "$work/mpi_check" 1048576 200 2>&1 | awk '/per round trip/ {print $(NF - 4)}'
}

rounds=$work/rounds
for r in $(seq "$n"); do
  TLS=rc_verbs ucx_pair put_bw -D zcopy -s 65536 -x rc_verbs -d roxe0:1 -n 20000
  put=$(field 6 "$work/c.out") # MB/s (average)
  write=$(roxe_perf write -s 65536 -n 20000 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["gbytes_per_s"] * 1e9 / 2**20, 1))')
  ucx_pair tag_lat -s 8 -n 20000
  tag=$(field 2 "$work/c.out") # p50 one way, µs
  lat=$(roxe_perf send --lat -s 8 -n 20000 | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["lat_us"]["p50"], 2))')
  ucx=$(mpi_rt env UCX_TLS=rc,self $R run -q --roxe-addr 127.0.231.5 -- mpirun "${root[@]}" -np 2 --oversubscribe --mca pml ucx --mca btl ^openib,uct)
  tcp=$(mpi_rt mpirun "${root[@]}" -np 2 --oversubscribe --mca pml ob1 --mca btl self,tcp)
  echo "round $r: put_bw_MBps ${put:-nan} write_MBps ${write:-nan} tag_lat_us ${tag:-nan} send_lat_us ${lat:-nan} mpi_ucx_us ${ucx:-nan} mpi_tcp_us ${tcp:-nan}" | tee -a "$rounds"
done
python3 - "$rounds" <<'PY'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    f = line.split(":", 1)[1].split()
    rows.append({f[i]: float(f[i + 1]) for i in range(0, len(f), 2)})
def med(name, f, goal):
    v = sorted(x for x in (f(r) for r in rows) if x == x)
    if v:
        print(f"{name} median {statistics.median(v):.3f} [{v[0]:.2f}-{v[-1]:.2f}] over {len(v)} rounds (goal {goal})")
med("put_bw/write", lambda r: r["put_bw_MBps"] / r["write_MBps"], ">= 0.9")
med("tag_lat/send_lat", lambda r: r["tag_lat_us"] / r["send_lat_us"], "<= 1.2")
med("mpi tcp/ucx", lambda r: r["mpi_tcp_us"] / r["mpi_ucx_us"], ">= 1.0")
PY
