#!/bin/bash
# One run of every comparison in docs/PERFORMANCE.md, printed as lines
# "name result": iperf3 TCP and UDP, sockperf ping-pong, `roxe perf`
# (with and without ROXE_GSO; READ and SEND; 64 B message rate; 1,024 QPs),
# perftest over the drop-in libibverbs, and the QP scale bench (creation
# rate, memory per idle QP).
# Needs: cargo build --release -p roxe-tools -p roxe-ibverbs; iperf3,
# sockperf and perftest (Debian packages). Loopback addresses only.
#
# --rounds N: instead, N interleaved rounds of the 64 KiB bandwidth goals
# (iperf3 TCP 2 s, `roxe perf write|read|send -s 65536`, `ib_write_bw -s
# 65536` over the drop-in, back to back), one line per round, then the
# per-round ratios' medians: a VM whose speed drifts for minutes at a
# time skews ratios of figures measured minutes apart.
set -u
R=$(cd "$(dirname "$0")/.." && pwd)/target/release
L=$R/ibverbs
if [ "${1:-}" = --rounds ]; then
  n=${2:?--rounds needs a count}
  rp() { # op -> GB/s
    ROXE_ADDR=127.0.221.1 $R/roxe perf $1 -s 65536 -n 30000 -p 18708 --json server >/dev/null 2>&1 & sleep 0.4
    ROXE_ADDR=127.0.221.2 $R/roxe perf $1 -s 65536 -n 30000 -p 18708 --json client 127.0.0.1 |
      python3 -c 'import json,sys; print(round(json.load(sys.stdin)["gbytes_per_s"],3))'
    wait
  }
  rounds=$(mktemp)
  for r in $(seq "$n"); do
    iperf3 -s -1 -p 5304 >/dev/null 2>&1 & sleep 0.3
    t=$(iperf3 -c 127.0.0.1 -p 5304 -t 2 -J | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9,3))')
    wait
    w=$(rp write); rd=$(rp read); sd=$(rp send)
    LD_LIBRARY_PATH=$L ROXE_ADDR=127.0.222.1 ib_write_bw -d roxe0 -x 0 -s 65536 -n 20000 -p 18709 >/dev/null 2>&1 & sleep 0.5
    ib=$(LD_LIBRARY_PATH=$L ROXE_ADDR=127.0.222.2 ib_write_bw -d roxe0 -x 0 -s 65536 -n 20000 -p 18709 127.0.0.1 | awk '/^ 65536/ {printf "%.3f", $4 * 1048576 / 1e9}')
    wait
    echo "round $r: tcp ${t:-nan} write ${w:-nan} read ${rd:-nan} send ${sd:-nan} ib_write_bw ${ib:-nan}" | tee -a "$rounds"
  done
  python3 - "$rounds" <<'PY'
import statistics, sys
rows = []
for line in open(sys.argv[1]):
    f = line.split(":", 1)[1].split()
    rows.append({f[i]: float(f[i + 1]) for i in range(0, len(f), 2)})
def med(name, f):
    v = sorted(x for x in (f(r) for r in rows) if x == x)
    if v:
        print(f"{name} median {statistics.median(v):.3f} [{v[0]:.2f}-{v[-1]:.2f}] over {len(v)} rounds")
for k in ("tcp", "write", "read", "send", "ib_write_bw"):
    med(k + "_GBps", lambda r: r[k])
med("write/tcp", lambda r: r["write"] / r["tcp"])
med("read/write", lambda r: r["read"] / r["write"])
med("send/write", lambda r: r["send"] / r["write"])
med("ib_write_bw/write", lambda r: r["ib_write_bw"] / r["write"])
PY
  rm -f "$rounds"
  exit 0
fi
# iperf3 TCP
iperf3 -s -1 -p 5301 >/dev/null 2>&1 & sleep 0.5
echo "iperf3_tcp_GBps $(iperf3 -c 127.0.0.1 -p 5301 -t 5 -J | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9,3))')"
wait
iperf3 -s -1 -p 5302 >/dev/null 2>&1 & sleep 0.5
echo "iperf3_udp4k_GBps $(iperf3 -c 127.0.0.1 -p 5302 -u -l 4096 -b 0 -t 5 -J | python3 -c 'import json,sys; d=json.load(sys.stdin)["end"]["sum"]; print(round(d["bytes"]*(1-d["lost_percent"]/100)/d["seconds"]/1e9,3))')"
wait
sockperf sr -i 127.0.0.1 -p 5303 >/dev/null 2>&1 & sp=$!; sleep 0.5
sockperf pp -i 127.0.0.1 -p 5303 -t 5 -m 64 2>&1 | grep -E "avg-latency|50.000" | sed 's/^/sockperf /'
kill $sp; wait 2>/dev/null
for gso in 0 1; do
  ROXE_GSO=$gso ROXE_ADDR=127.0.221.1 $R/roxe perf write -s 65536 -n 20000 -p 18701 --json server >/dev/null 2>&1 & sleep 0.5
  echo "roxe_write64k_gso$gso $(ROXE_GSO=$gso ROXE_ADDR=127.0.221.2 $R/roxe perf write -s 65536 -n 20000 -p 18701 --json client 127.0.0.1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("gbytes_per_s", d))')"
  wait
done
for op in read send; do
  ROXE_ADDR=127.0.221.1 $R/roxe perf $op -s 65536 -n 20000 -p 18701 --json server >/dev/null 2>&1 & sleep 0.5
  echo "roxe_${op}64k $(ROXE_ADDR=127.0.221.2 $R/roxe perf $op -s 65536 -n 20000 -p 18701 --json client 127.0.0.1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("gbytes_per_s", d))')"
  wait
done
# Message rate: 64 B SENDs (roxe perf posts each refill as one post list).
ROXE_ADDR=127.0.221.1 $R/roxe perf send -s 64 -n 500000 -p 18705 --json server >/dev/null 2>&1 & sleep 0.5
echo "roxe_send64_Mmsgs $(ROXE_ADDR=127.0.221.2 $R/roxe perf send -s 64 -n 500000 -p 18705 --json client 127.0.0.1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("mmsgs_per_s", d))')"
wait
# 1,024 QPs sharing the load round robin (64 KiB WRITEs), and 1 QP with
# the same per-QP depth for the ratio.
for q in 1 1024; do
  ROXE_ADDR=127.0.221.1 $R/roxe perf write -s 65536 -n 30720 -q $q -t 16 -r 16 -p 18706 --json server >/dev/null 2>&1 & sleep 0.5
  echo "roxe_write64k_q$q $(ROXE_ADDR=127.0.221.2 $R/roxe perf write -s 65536 -n 30720 -q $q -t 16 -r 16 -p 18706 --json client 127.0.0.1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("gbytes_per_s", d))')"
  wait
done
ROXE_ADDR=127.0.221.1 $R/roxe perf write -s 64 --lat -n 20000 -p 18702 --json server >/dev/null 2>&1 & sleep 0.5
echo "roxe_lat64 $(ROXE_ADDR=127.0.221.2 $R/roxe perf write -s 64 --lat -n 20000 -p 18702 --json client 127.0.0.1)"
wait
export LD_LIBRARY_PATH=$L
for q in "-l 16" "-q 4"; do
  ROXE_ADDR=127.0.222.1 ib_send_bw -d roxe0 -x 0 -s 64 -n 200000 $q -p 18707 >/dev/null 2>&1 & sleep 0.5
  echo "ib_send_bw_64 $q $(ROXE_ADDR=127.0.222.2 ib_send_bw -d roxe0 -x 0 -s 64 -n 200000 $q -p 18707 127.0.0.1 | grep -E '^ 64 ')"
  wait
done
# perftest prints MiB/s (2^20 bytes, its --help says so): GB/s (10^9) is
# printed beside it, the unit of the other figures.
for t in ib_write_bw ib_send_bw ib_read_bw; do
  ROXE_ADDR=127.0.222.1 $t -d roxe0 -x 0 -s 65536 -n 20000 -p 18703 >/dev/null 2>&1 & sleep 0.5
  echo "$t $(ROXE_ADDR=127.0.222.2 $t -d roxe0 -x 0 -s 65536 -n 20000 -p 18703 127.0.0.1 | awk '/^ 65536/ {printf "%s GBps %.3f", $0, $4 * 1048576 / 1e9}')"
  wait
done
for t in ib_write_lat ib_send_lat ib_read_lat ib_atomic_lat; do
  s=64; [ $t = ib_atomic_lat ] && s=8
  ROXE_ADDR=127.0.223.1 $t -d roxe0 -x 0 -s $s -n 20000 -p 18704 >/dev/null 2>&1 & sleep 0.5
  echo "$t $(ROXE_ADDR=127.0.223.2 $t -d roxe0 -x 0 -s $s -n 20000 -p 18704 127.0.0.1 | grep -E "^ $s " )"
  wait
done
# QP creation + connection rate and memory per idle QP (10,000 QPs).
(cd "$R/../.." && cargo bench -q --bench qp_scale 2>/dev/null | grep '^qp_scale')
