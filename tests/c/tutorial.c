/*
 * tutorial.c -- a classic "first RDMA program", written the way a user of
 * libibverbs would write it: nothing in here knows about roxe.
 *
 *   server:  tutorial [-d dev] [-g gid_idx] [-p port] [-s size] [-m mtu] [-t secs]
 *   client:  tutorial [-d dev] [-g gid_idx] [-p port] [-s size] [-m mtu] [-t secs] HOST
 *
 * Both sides open a device, create a PD, a CQ, one MR and an RC QP,
 * exchange QPN, LID, GID, PSN, rkey and buffer address over TCP, move the
 * QP RESET -> INIT -> RTR -> RTS (with the GID, is_global = 1, when -g is
 * given; LID only, is_global = 0, otherwise), and then:
 *
 *   1. SEND/RECV a message in both directions and check every byte;
 *   2. RDMA WRITE a pattern into the peer's buffer; after a TCP barrier
 *      each side checks the bytes the peer wrote into its own buffer;
 *   3. RDMA READ the peer's buffer back (the bytes this side wrote) and
 *      check every byte.
 *
 * With -w 1 or -w 2 the peer's buffer is reached through a memory window
 * of that type instead of the MR's rkey: each side binds one over its RDMA
 * target (type 1 with ibv_bind_mw, type 2 with an IBV_WR_BIND_MW work
 * request) after RTS and sends the window's key over TCP. Then
 *
 *   4. each side ends its window: type 2 by the peer's SEND_WITH_INV, whose
 *      receive completion must carry IBV_WC_WITH_INV and the key; type 1 by
 *      ibv_dealloc_mw;
 *   5. the client's RDMA WRITE through the server's ended key must fail
 *      with IBV_WC_REM_ACCESS_ERR (which leaves both QPs in ERR).
 *
 * Every completion wait is bounded (-t, default 10 s). On success each side
 * prints "server: OK: ..." or "client: OK: ..." and exits 0; on any failure
 * it prints what failed on stderr and exits 1.
 *
 * Build: cc -Wall -O2 -o tutorial tutorial.c -libverbs
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* wr_ids, so a completion can be matched to what was posted. */
enum {
	WRID_RECV = 1,
	WRID_SEND = 2,
	WRID_WRITE = 3,
	WRID_READ = 4,
	WRID_BIND = 5,
	WRID_RECV_INV = 6,
	WRID_SEND_INV = 7,
	WRID_STALE = 8,
	WRID_FENCE_RECV = 9,
	WRID_FENCE_SEND = 10,
};

/* What each side tells the other over TCP. */
struct peer_info {
	uint32_t qpn;
	uint16_t lid;
	uint32_t psn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

/* "qpn:lid:psn:rkey:addr:gid" in fixed-width hex, NUL-terminated. */
#define MSG_LEN (6 + 1 + 4 + 1 + 6 + 1 + 8 + 1 + 16 + 1 + 32 + 1)

static const char *prog = "tutorial";
static int role_server;
static double timeout_s = 10.0;

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: %s: ", prog, role_server ? "server" : "client");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static double now(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts))
		die("clock_gettime: %s", strerror(errno));
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr,
		"Usage:\n"
		"  %s [options]          start a server and wait for a client\n"
		"  %s [options] HOST     connect to the server at HOST\n"
		"Options:\n"
		"  -d NAME   IB device (default: the first one)\n"
		"  -i PORT   IB port (default 1)\n"
		"  -g IDX    GID index: address the peer by GID (is_global = 1);\n"
		"            without -g the QP is addressed by LID only\n"
		"  -p PORT   TCP port (default 19875)\n"
		"  -s SIZE   message and buffer size in bytes (default 4096)\n"
		"  -m MTU    path MTU 256..4096 (default: the port's active MTU)\n"
		"  -t SECS   longest wait for a completion or the peer (default 10)\n"
		"  -w TYPE   reach the peer's buffer through a memory window of\n"
		"            type 1 or 2, then end it and check the key is dead\n",
		prog, prog);
	exit(1);
}

/* ------------------------------------------------------------------ */
/* TCP                                                                 */

static void set_timeouts(int fd)
{
	struct timeval tv = {
		.tv_sec = (time_t)timeout_s + 5,
		.tv_usec = 0,
	};

	if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)))
		die("setsockopt(SO_RCVTIMEO/SO_SNDTIMEO): %s", strerror(errno));
}

static int tcp_server(int port)
{
	struct sockaddr_in6 sa;
	struct pollfd pfd;
	int one = 1, zero = 0;
	int lfd, fd, n;

	lfd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		die("socket: %s", strerror(errno));
	if (setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)))
		die("setsockopt(SO_REUSEADDR): %s", strerror(errno));
	if (setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)))
		die("setsockopt(IPV6_V6ONLY): %s", strerror(errno));
	memset(&sa, 0, sizeof(sa));
	sa.sin6_family = AF_INET6;
	sa.sin6_addr = in6addr_any;
	sa.sin6_port = htons(port);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)))
		die("bind to TCP port %d: %s", port, strerror(errno));
	if (listen(lfd, 1))
		die("listen: %s", strerror(errno));

	/* A client that never comes must not hang the server forever. */
	pfd.fd = lfd;
	pfd.events = POLLIN;
	n = poll(&pfd, 1, (int)(timeout_s * 6 * 1000));
	if (n < 0)
		die("poll on the listening socket: %s", strerror(errno));
	if (n == 0)
		die("no client connected to TCP port %d within %.0f s", port,
		    timeout_s * 6);
	fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0)
		die("accept: %s", strerror(errno));
	if (close(lfd))
		die("close: %s", strerror(errno));
	set_timeouts(fd);
	return fd;
}

static int tcp_client(const char *host, int port)
{
	struct addrinfo hints, *res, *ai;
	char service[16];
	double deadline = now() + timeout_s;
	int fd = -1, err, last_errno = 0;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(service, sizeof(service), "%d", port);
	err = getaddrinfo(host, service, &hints, &res);
	if (err)
		die("getaddrinfo(%s): %s", host, gai_strerror(err));

	/* The server may not listen yet: retry refused connections a while. */
	for (;;) {
		for (ai = res; ai; ai = ai->ai_next) {
			fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
				    ai->ai_protocol);
			if (fd < 0) {
				last_errno = errno;
				continue;
			}
			if (!connect(fd, ai->ai_addr, ai->ai_addrlen))
				break;
			last_errno = errno;
			close(fd);
			fd = -1;
		}
		if (fd >= 0 || now() > deadline)
			break;
		usleep(100 * 1000);
	}
	freeaddrinfo(res);
	if (fd < 0)
		die("couldn't connect to %s:%d: %s", host, port,
		    strerror(last_errno));
	set_timeouts(fd);
	return fd;
}

static void write_full(int fd, const void *buf, size_t len, const char *what)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("sending %s to the peer: %s", what,
			    n < 0 ? strerror(errno) : "wrote 0 bytes");
		p += n;
		len -= n;
	}
}

static void read_full(int fd, void *buf, size_t len, const char *what)
{
	char *p = buf;

	while (len) {
		ssize_t n = read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			die("reading %s from the peer: %s", what,
			    errno == EAGAIN ? "timed out" : strerror(errno));
		if (n == 0)
			die("reading %s from the peer: connection closed", what);
		p += n;
		len -= n;
	}
}

/* Both sides write a byte and read the other's: neither goes on before
 * the other has reached the same point. */
static void barrier(int fd, char tag)
{
	char got;
	char what[32];

	snprintf(what, sizeof(what), "barrier '%c'", tag);
	write_full(fd, &tag, 1, what);
	read_full(fd, &got, 1, what);
	if (got != tag)
		die("%s: the peer sent '%c'", what, got);
}

static void gid_to_hex(const union ibv_gid *gid, char *out)
{
	int i;

	for (i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", gid->raw[i]);
}

static int hex_to_gid(const char *hex, union ibv_gid *gid)
{
	int i;

	for (i = 0; i < 16; i++) {
		unsigned int b;

		if (sscanf(hex + 2 * i, "%2x", &b) != 1)
			return -1;
		gid->raw[i] = b;
	}
	return 0;
}

static void exchange(int fd, const struct peer_info *me, struct peer_info *peer)
{
	char msg[MSG_LEN], gid[33];
	unsigned int qpn, lid, psn, rkey;
	unsigned long long addr;
	int n;

	gid_to_hex(&me->gid, gid);
	n = snprintf(msg, sizeof(msg), "%06x:%04x:%06x:%08x:%016llx:%s",
		     me->qpn, me->lid, me->psn, me->rkey,
		     (unsigned long long)me->addr, gid);
	if (n != MSG_LEN - 1)
		die("internal error: message is %d bytes, not %d", n, MSG_LEN - 1);
	write_full(fd, msg, sizeof(msg), "the connection data");
	memset(msg, 0, sizeof(msg));
	read_full(fd, msg, sizeof(msg), "the connection data");
	if (msg[MSG_LEN - 1] != '\0' ||
	    sscanf(msg, "%x:%x:%x:%x:%llx:%32s", &qpn, &lid, &psn, &rkey, &addr,
		   gid) != 6 ||
	    strlen(gid) != 32 || hex_to_gid(gid, &peer->gid))
		die("malformed connection data from the peer: \"%.*s\"",
		    MSG_LEN - 1, msg);
	peer->qpn = qpn;
	peer->lid = lid;
	peer->psn = psn;
	peer->rkey = rkey;
	peer->addr = addr;
}

/* ------------------------------------------------------------------ */
/* Verbs                                                               */

static const char *opcode_str(enum ibv_wc_opcode op)
{
	switch (op) {
	case IBV_WC_SEND: return "SEND";
	case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
	case IBV_WC_RDMA_READ: return "RDMA_READ";
	case IBV_WC_COMP_SWAP: return "COMP_SWAP";
	case IBV_WC_FETCH_ADD: return "FETCH_ADD";
	case IBV_WC_BIND_MW: return "BIND_MW";
	case IBV_WC_LOCAL_INV: return "LOCAL_INV";
	case IBV_WC_RECV: return "RECV";
	case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
	default: return "unknown opcode";
	}
}

/*
 * Poll the CQ until every wr_id in `want` (a bitmask of 1 << WRID_*) has
 * completed successfully with the expected opcode; give up after
 * timeout_s. Returns the byte_len of the RECV completion, if any.
 */
static uint32_t wait_completions(struct ibv_cq *cq, unsigned int want,
				 const char *step, uint32_t qpn)
{
	double deadline = now() + timeout_s;
	uint32_t recv_len = 0;
	unsigned int idle = 0;

	while (want) {
		struct ibv_wc wc[4];
		int n, i;

		n = ibv_poll_cq(cq, 4, wc);
		if (n < 0)
			die("%s: ibv_poll_cq returned %d", step, n);
		if (n == 0) {
			if (now() > deadline)
				die("%s: no completion within %.0f s (still waiting for wr_id mask 0x%x)",
				    step, timeout_s, want);
			/* Spin a little, then stop hogging the CPU. */
			if (++idle > 1000)
				usleep(20);
			continue;
		}
		idle = 0;
		for (i = 0; i < n; i++) {
			enum ibv_wc_opcode expect;

			if (wc[i].status != IBV_WC_SUCCESS)
				die("%s: completion for wr_id %" PRIu64 " failed: %s (%d), vendor_err 0x%x",
				    step, wc[i].wr_id,
				    ibv_wc_status_str(wc[i].status),
				    wc[i].status, wc[i].vendor_err);
			if (wc[i].wr_id >= 32 || !(want & (1u << wc[i].wr_id)))
				die("%s: unexpected completion, wr_id %" PRIu64 " (%s)",
				    step, wc[i].wr_id, opcode_str(wc[i].opcode));
			switch (wc[i].wr_id) {
			case WRID_RECV: case WRID_RECV_INV: case WRID_FENCE_RECV:
				expect = IBV_WC_RECV; break;
			case WRID_SEND: case WRID_SEND_INV: case WRID_FENCE_SEND:
				expect = IBV_WC_SEND; break;
			case WRID_WRITE: expect = IBV_WC_RDMA_WRITE; break;
			case WRID_BIND: expect = IBV_WC_BIND_MW; break;
			default: expect = IBV_WC_RDMA_READ; break;
			}
			if (wc[i].opcode != expect)
				die("%s: wr_id %" PRIu64 " completed as %s (%d), expected %s",
				    step, wc[i].wr_id, opcode_str(wc[i].opcode),
				    wc[i].opcode, opcode_str(expect));
			if (wc[i].qp_num != qpn)
				die("%s: wr_id %" PRIu64 " completed on QP 0x%x, not 0x%x",
				    step, wc[i].wr_id, wc[i].qp_num, qpn);
			if (wc[i].wr_id == WRID_RECV)
				recv_len = wc[i].byte_len;
			if (wc[i].wr_id == WRID_RECV_INV) {
				/* rxe's kernel writes its own IB_WC_WITH_INVALIDATE
				 * (1 << 2, libibverbs' IBV_WC_IP_CSUM_OK) into user
				 * CQs: accept it, with a note; the key must match
				 * either way, and the key's death is checked next. */
				if (!(wc[i].wc_flags & IBV_WC_WITH_INV)) {
					if (!(wc[i].wc_flags & IBV_WC_IP_CSUM_OK))
						die("%s: the receive does not report an invalidation (wc_flags 0x%x)",
						    step, wc[i].wc_flags);
					printf("  note: the invalidation is flagged 0x%x (the kernel's IB_WC_WITH_INVALIDATE), not IBV_WC_WITH_INV\n",
					       wc[i].wc_flags);
				}
				recv_len = wc[i].invalidated_rkey;
			}
			want &= ~(1u << wc[i].wr_id);
		}
	}
	return recv_len;
}

/* The byte at offset i of a pattern: differs per side and per purpose. */
static unsigned char pattern(int server, int purpose, size_t i)
{
	return (unsigned char)(i * 7 + (i >> 8) * 13 + (server ? 0x5a : 0xa5) +
			       purpose * 0x31);
}

static void fill(unsigned char *buf, size_t len, int server, int purpose)
{
	size_t i;

	for (i = 0; i < len; i++)
		buf[i] = pattern(server, purpose, i);
}

static void check(const unsigned char *buf, size_t len, int server, int purpose,
		  const char *what)
{
	size_t i;

	for (i = 0; i < len; i++) {
		unsigned char want = pattern(server, purpose, i);

		if (buf[i] != want)
			die("%s: byte %zu of %zu is 0x%02x, expected 0x%02x",
			    what, i, len, buf[i], want);
	}
}

enum { P_SEND = 0, P_WRITE = 1 };

/* Wait for the one completion of `wr_id` and check it failed with `want`. */
static void wait_failure(struct ibv_cq *cq, uint64_t wr_id, enum ibv_wc_status want,
			 const char *step)
{
	double deadline = now() + timeout_s;
	struct ibv_wc wc;
	int n;

	for (;;) {
		n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("%s: ibv_poll_cq returned %d", step, n);
		if (n == 1)
			break;
		if (now() > deadline)
			die("%s: no completion within %.0f s", step, timeout_s);
		usleep(20);
	}
	if (wc.wr_id != wr_id)
		die("%s: unexpected completion, wr_id %" PRIu64, step, wc.wr_id);
	if (wc.status != want)
		die("%s: completed with %s (%d), expected %s", step,
		    ibv_wc_status_str(wc.status), wc.status, ibv_wc_status_str(want));
}

/* Exchange one 32-bit key over TCP. */
static uint32_t exchange_key(int fd, uint32_t mine)
{
	char msg[9], got[9];
	unsigned int key;

	snprintf(msg, sizeof(msg), "%08x", mine);
	write_full(fd, msg, sizeof(msg), "the window key");
	read_full(fd, got, sizeof(got), "the window key");
	if (got[8] != '\0' || sscanf(got, "%x", &key) != 1)
		die("malformed window key from the peer");
	return key;
}

static void print_gid(const char *label, const struct peer_info *p)
{
	char str[INET6_ADDRSTRLEN];

	if (!inet_ntop(AF_INET6, p->gid.raw, str, sizeof(str)))
		die("inet_ntop: %s", strerror(errno));
	printf("  %s QPN 0x%06x, LID 0x%04x, PSN 0x%06x, RKEY 0x%08x, ADDR 0x%016" PRIx64 ", GID %s\n",
	       label, p->qpn, p->lid, p->psn, p->rkey, p->addr, str);
}

static enum ibv_mtu mtu_from_bytes(int mtu)
{
	switch (mtu) {
	case 256: return IBV_MTU_256;
	case 512: return IBV_MTU_512;
	case 1024: return IBV_MTU_1024;
	case 2048: return IBV_MTU_2048;
	case 4096: return IBV_MTU_4096;
	default: return 0;
	}
}

int main(int argc, char **argv)
{
	struct ibv_device **dev_list;
	struct ibv_device *dev = NULL;
	struct ibv_context *ctx;
	struct ibv_port_attr port_attr;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr init_attr;
	struct ibv_qp_attr attr;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr, *bad_rwr;
	struct ibv_send_wr swr, *bad_swr;
	struct peer_info me, peer;
	const char *dev_name = NULL, *host = NULL;
	unsigned char *buf, *send_buf, *recv_buf, *rdma_buf, *read_buf;
	size_t size = 4096;
	int gid_idx = -1, tcp_port = 19875, ib_port = 1, mtu = 0, mw_type = 0;
	struct ibv_mw *mw = NULL;
	uint32_t mw_key = 0;
	int num_devices, i, ret, fd, opt;
	enum ibv_mtu path_mtu;
	uint32_t got_len;
	double t0;

	while ((opt = getopt(argc, argv, "d:g:i:p:s:m:t:w:h")) != -1) {
		char *end;
		long v;

		if (opt == 'd') {
			dev_name = optarg;
			continue;
		}
		if (opt == 'h' || opt == '?')
			usage();
		errno = 0;
		v = strtol(optarg, &end, 0);
		if (errno || *end || end == optarg || v < 0) {
			fprintf(stderr, "%s: bad value for -%c: %s\n", prog, opt, optarg);
			usage();
		}
		switch (opt) {
		case 'g': gid_idx = (int)v; break;
		case 'i': ib_port = (int)v; break;
		case 'p': tcp_port = (int)v; break;
		case 's': size = (size_t)v; break;
		case 'm': mtu = (int)v; break;
		case 't': timeout_s = (double)v; break;
		case 'w': mw_type = (int)v; break;
		}
	}
	if (optind == argc - 1)
		host = argv[optind];
	else if (optind != argc)
		usage();
	role_server = host == NULL;
	if (size == 0 || size > (1u << 30))
		die("size must be 1 .. 2^30 bytes");
	if (tcp_port <= 0 || tcp_port > 65535)
		die("bad TCP port %d", tcp_port);
	if (mtu && !mtu_from_bytes(mtu))
		die("bad MTU %d (256, 512, 1024, 2048 or 4096)", mtu);
	if (timeout_s < 1)
		timeout_s = 1;
	if (mw_type != 0 && mw_type != 1 && mw_type != 2)
		die("bad memory window type %d (1 or 2)", mw_type);
	srand48(getpid() * 1000003L ^ time(NULL));

	/* 1. Find the device. */
	dev_list = ibv_get_device_list(&num_devices);
	if (!dev_list)
		die("ibv_get_device_list: %s", strerror(errno));
	if (num_devices == 0)
		die("no RDMA devices found");
	for (i = 0; i < num_devices; i++) {
		const char *name = ibv_get_device_name(dev_list[i]);

		if (!name)
			die("ibv_get_device_name(device %d) returned NULL", i);
		if (!dev_name || !strcmp(name, dev_name)) {
			dev = dev_list[i];
			break;
		}
	}
	if (!dev)
		die("device %s not found (%d devices)", dev_name, num_devices);

	/* 2. Open it and look at the port. */
	ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device(%s): %s", ibv_get_device_name(dev), strerror(errno));
	ret = ibv_query_port(ctx, ib_port, &port_attr);
	if (ret)
		die("ibv_query_port(%d): %s", ib_port, strerror(ret));
	if (port_attr.state != IBV_PORT_ACTIVE)
		die("port %d is not active (state %d)", ib_port, port_attr.state);
	path_mtu = mtu ? mtu_from_bytes(mtu) : port_attr.active_mtu;
	if (path_mtu > port_attr.active_mtu)
		die("MTU %d is larger than the port's active MTU (enum %d)", mtu,
		    port_attr.active_mtu);

	memset(&me, 0, sizeof(me));
	me.lid = port_attr.lid;
	if (gid_idx >= 0) {
		static const union ibv_gid zero;

		if (gid_idx >= port_attr.gid_tbl_len)
			die("GID index %d out of range (gid_tbl_len %d)", gid_idx,
			    port_attr.gid_tbl_len);
		if (ibv_query_gid(ctx, ib_port, gid_idx, &me.gid))
			die("ibv_query_gid(port %d, index %d): %s", ib_port,
			    gid_idx, strerror(errno));
		if (!memcmp(&me.gid, &zero, sizeof(zero)))
			die("GID index %d is empty", gid_idx);
	} else if (port_attr.lid == 0) {
		die("port %d has no LID (link layer %s): give a GID index with -g",
		    ib_port,
		    port_attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "IB");
	}

	/* 3. PD, CQ and one MR: [send | recv | rdma target | read dest]. */
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq: %s", strerror(errno));
	buf = aligned_alloc(4096, (4 * size + 4095) / 4096 * 4096);
	if (!buf)
		die("aligned_alloc(%zu): %s", 4 * size, strerror(errno));
	send_buf = buf;
	recv_buf = buf + size;
	rdma_buf = buf + 2 * size;
	read_buf = buf + 3 * size;
	fill(send_buf, size, role_server, P_SEND);
	memset(recv_buf, 0, size);
	memset(rdma_buf, 0, size);
	memset(read_buf, 0, size);
	mr = ibv_reg_mr(pd, buf, 4 * size,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			IBV_ACCESS_REMOTE_READ | (mw_type ? IBV_ACCESS_MW_BIND : 0));
	if (!mr)
		die("ibv_reg_mr(%zu bytes): %s", 4 * size, strerror(errno));

	/* 4. The RC QP. */
	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.send_cq = cq;
	init_attr.recv_cq = cq;
	init_attr.qp_type = IBV_QPT_RC;
	init_attr.sq_sig_all = 1;
	init_attr.cap.max_send_wr = 8;
	init_attr.cap.max_recv_wr = 8;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &init_attr);
	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	if (qp->qp_type != IBV_QPT_RC || qp->state != IBV_QPS_RESET)
		die("new QP has type %d, state %d (expected RC, RESET)",
		    qp->qp_type, qp->state);

	/* 5. RESET -> INIT, and post the receive for the peer's SEND. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.pkey_index = 0;
	attr.port_num = ib_port;
	attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			       IBV_ACCESS_REMOTE_READ;
	ret = ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			    IBV_QP_ACCESS_FLAGS);
	if (ret)
		die("ibv_modify_qp(INIT): %s", strerror(ret));

	sge.addr = (uintptr_t)recv_buf;
	sge.length = (uint32_t)size;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = WRID_RECV;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	ret = ibv_post_recv(qp, &rwr, &bad_rwr);
	if (ret)
		die("ibv_post_recv: %s", strerror(ret));

	/* 6. Exchange the connection data over TCP. */
	me.qpn = qp->qp_num;
	me.psn = lrand48() & 0xffffff;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)rdma_buf;
	fd = role_server ? tcp_server(tcp_port) : tcp_client(host, tcp_port);
	exchange(fd, &me, &peer);
	printf("%s: device %s, port %d, %s, MTU %d, %zu bytes\n",
	       role_server ? "server" : "client", ibv_get_device_name(dev),
	       ib_port, gid_idx >= 0 ? "GID" : "LID only",
	       128 << path_mtu, size);
	print_gid("local: ", &me);
	print_gid("remote:", &peer);
	fflush(stdout);
	if (gid_idx < 0 && peer.lid == 0)
		die("the peer has no LID: run both sides with -g");

	/* 7. INIT -> RTR -> RTS. */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTR;
	attr.path_mtu = path_mtu;
	attr.dest_qp_num = peer.qpn;
	attr.rq_psn = peer.psn;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.dlid = peer.lid;
	attr.ah_attr.sl = 0;
	attr.ah_attr.src_path_bits = 0;
	attr.ah_attr.port_num = ib_port;
	if (gid_idx >= 0) {
		attr.ah_attr.is_global = 1;
		attr.ah_attr.grh.dgid = peer.gid;
		attr.ah_attr.grh.sgid_index = gid_idx;
		attr.ah_attr.grh.hop_limit = 1;
		attr.ah_attr.grh.flow_label = 0;
		attr.ah_attr.grh.traffic_class = 0;
	} else {
		attr.ah_attr.is_global = 0;
	}
	ret = ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ret)
		die("ibv_modify_qp(RTR): %s", strerror(ret));

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = me.psn;
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.max_rd_atomic = 1;
	ret = ibv_modify_qp(qp, &attr,
			    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			    IBV_QP_MAX_QP_RD_ATOMIC);
	if (ret)
		die("ibv_modify_qp(RTS): %s", strerror(ret));
	if (qp->state != IBV_QPS_RTS)
		die("QP state is %d after the move to RTS", qp->state);

	/* 7b. With -w: a window over the RDMA target, its key to the peer. */
	if (mw_type) {
		mw = ibv_alloc_mw(pd, mw_type == 1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
		if (!mw)
			die("ibv_alloc_mw(type %d): %s", mw_type, strerror(errno));
		if (mw_type == 1) {
			struct ibv_mw_bind bind = {
				.wr_id = WRID_BIND,
				.send_flags = IBV_SEND_SIGNALED,
				.bind_info = {
					.mr = mr,
					.addr = (uintptr_t)rdma_buf,
					.length = size,
					.mw_access_flags = IBV_ACCESS_REMOTE_WRITE |
							   IBV_ACCESS_REMOTE_READ,
				},
			};

			ret = ibv_bind_mw(qp, mw, &bind);
			if (ret)
				die("ibv_bind_mw: %s", strerror(ret));
			mw_key = mw->rkey;
		} else {
			memset(&swr, 0, sizeof(swr));
			swr.wr_id = WRID_BIND;
			swr.opcode = IBV_WR_BIND_MW;
			swr.send_flags = IBV_SEND_SIGNALED;
			swr.bind_mw.mw = mw;
			swr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
			swr.bind_mw.bind_info.mr = mr;
			swr.bind_mw.bind_info.addr = (uintptr_t)rdma_buf;
			swr.bind_mw.bind_info.length = size;
			swr.bind_mw.bind_info.mw_access_flags =
				IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
			ret = ibv_post_send(qp, &swr, &bad_swr);
			if (ret)
				die("ibv_post_send(BIND_MW): %s", strerror(ret));
			mw_key = swr.bind_mw.rkey;
		}
		wait_completions(cq, 1u << WRID_BIND, "BIND_MW", qp->qp_num);
		peer.rkey = exchange_key(fd, mw_key);
		printf("  window: type %d, local key 0x%08x, remote key 0x%08x\n",
		       mw_type, mw_key, peer.rkey);
		fflush(stdout);
	}

	/* Both QPs are ready to receive before anybody sends. */
	barrier(fd, 'R');
	t0 = now();

	/* 8. SEND/RECV both ways. */
	sge.addr = (uintptr_t)send_buf;
	sge.length = (uint32_t)size;
	sge.lkey = mr->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = WRID_SEND;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	ret = ibv_post_send(qp, &swr, &bad_swr);
	if (ret)
		die("ibv_post_send(SEND): %s", strerror(ret));
	got_len = wait_completions(cq, 1u << WRID_SEND | 1u << WRID_RECV,
				   "SEND/RECV", qp->qp_num);
	if (got_len != size)
		die("RECV completed with %u bytes, expected %zu", got_len, size);
	check(recv_buf, size, !role_server, P_SEND, "received message");

	/* 9. RDMA WRITE our pattern into the peer's buffer. */
	fill(send_buf, size, role_server, P_WRITE);
	sge.addr = (uintptr_t)send_buf;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = WRID_WRITE;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.rdma.remote_addr = peer.addr;
	swr.wr.rdma.rkey = peer.rkey;
	ret = ibv_post_send(qp, &swr, &bad_swr);
	if (ret)
		die("ibv_post_send(RDMA_WRITE): %s", strerror(ret));
	wait_completions(cq, 1u << WRID_WRITE, "RDMA WRITE", qp->qp_num);
	/* Our write has landed (its completion says so); wait for the peer's. */
	barrier(fd, 'W');
	check(rdma_buf, size, !role_server, P_WRITE, "buffer written by the peer");

	/* 10. RDMA READ back what we wrote into the peer's buffer. */
	sge.addr = (uintptr_t)read_buf;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = WRID_READ;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_RDMA_READ;
	swr.send_flags = IBV_SEND_SIGNALED;
	swr.wr.rdma.remote_addr = peer.addr;
	swr.wr.rdma.rkey = peer.rkey;
	ret = ibv_post_send(qp, &swr, &bad_swr);
	if (ret)
		die("ibv_post_send(RDMA_READ): %s", strerror(ret));
	wait_completions(cq, 1u << WRID_READ, "RDMA READ", qp->qp_num);
	check(read_buf, size, role_server, P_WRITE, "buffer read back from the peer");

	/* The peer may still be reading our buffer: tear down only after it. */
	barrier(fd, 'D');

	/* 10b. With -w: end the windows, then check their keys are dead. */
	if (mw_type == 2) {
		uint32_t inv;

		sge.addr = (uintptr_t)recv_buf;
		sge.length = (uint32_t)size;
		memset(&rwr, 0, sizeof(rwr));
		rwr.wr_id = WRID_RECV_INV;
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		ret = ibv_post_recv(qp, &rwr, &bad_rwr);
		if (ret)
			die("ibv_post_recv: %s", strerror(ret));
		barrier(fd, 'V');
		sge.addr = (uintptr_t)send_buf;
		sge.length = 16;
		memset(&swr, 0, sizeof(swr));
		swr.wr_id = WRID_SEND_INV;
		swr.sg_list = &sge;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_SEND_WITH_INV;
		swr.send_flags = IBV_SEND_SIGNALED;
		swr.invalidate_rkey = peer.rkey;
		ret = ibv_post_send(qp, &swr, &bad_swr);
		if (ret)
			die("ibv_post_send(SEND_WITH_INV): %s", strerror(ret));
		inv = wait_completions(cq, 1u << WRID_SEND_INV | 1u << WRID_RECV_INV,
				       "SEND_WITH_INV", qp->qp_num);
		if (inv != mw_key)
			die("the receive invalidated key 0x%08x, not our window's 0x%08x",
			    inv, mw_key);
	} else if (mw_type == 1) {
		/* A type 1 window ends when it is deallocated (or rebound). First
		 * a zero-length SEND each way: once the peer's has arrived, so
		 * has every request the peer sent before it, such as a late
		 * duplicate of its READ through our window (a retransmission
		 * that crossed its completion), which would otherwise find the
		 * window gone and fail our QP. */
		memset(&rwr, 0, sizeof(rwr));
		rwr.wr_id = WRID_FENCE_RECV;
		ret = ibv_post_recv(qp, &rwr, &bad_rwr);
		if (ret)
			die("ibv_post_recv(fence): %s", strerror(ret));
		barrier(fd, 'F');
		memset(&swr, 0, sizeof(swr));
		swr.wr_id = WRID_FENCE_SEND;
		swr.opcode = IBV_WR_SEND;
		swr.send_flags = IBV_SEND_SIGNALED;
		ret = ibv_post_send(qp, &swr, &bad_swr);
		if (ret)
			die("ibv_post_send(fence): %s", strerror(ret));
		wait_completions(cq, 1u << WRID_FENCE_SEND | 1u << WRID_FENCE_RECV,
				 "fence SEND", qp->qp_num);
		ret = ibv_dealloc_mw(mw);
		if (ret)
			die("ibv_dealloc_mw: %s", strerror(ret));
		mw = NULL;
	}
	if (mw_type && role_server) {
		/* The client checks the server's ended key (a remote access error
		 * moves both QPs to ERR, so one check per connection). */
		barrier(fd, 'I');
		barrier(fd, 'E');
		printf("server: OK: window type %d ended (%s)\n", mw_type,
		       mw_type == 2 ? "SEND_WITH_INV reported" : "deallocated");
		fflush(stdout);
	} else if (mw_type) {
		barrier(fd, 'I');
		sge.addr = (uintptr_t)send_buf;
		sge.length = 64;
		memset(&swr, 0, sizeof(swr));
		swr.wr_id = WRID_STALE;
		swr.sg_list = &sge;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_RDMA_WRITE;
		swr.send_flags = IBV_SEND_SIGNALED;
		swr.wr.rdma.remote_addr = peer.addr;
		swr.wr.rdma.rkey = peer.rkey;
		ret = ibv_post_send(qp, &swr, &bad_swr);
		if (ret)
			die("ibv_post_send(RDMA_WRITE through the ended window): %s",
			    strerror(ret));
		wait_failure(cq, WRID_STALE, IBV_WC_REM_ACCESS_ERR,
			     "RDMA WRITE through the ended window");
		/* Neither side tears down while the other's check runs. */
		barrier(fd, 'E');
		printf("client: OK: window type %d ended (%s), its key refused\n", mw_type,
		       mw_type == 2 ? "SEND_WITH_INV reported" : "deallocated");
		fflush(stdout);
	}
	printf("%s: OK: SEND/RECV %zu bytes each way, RDMA WRITE %zu bytes, RDMA READ %zu bytes, all verified in %.3f ms\n",
	       role_server ? "server" : "client", size, size, size,
	       (now() - t0) * 1e3);
	fflush(stdout);

	/* 11. Tear down, checking every step. */
	if (close(fd))
		die("close: %s", strerror(errno));
	ret = ibv_destroy_qp(qp);
	if (ret)
		die("ibv_destroy_qp: %s", strerror(ret));
	if (mw) {
		ret = ibv_dealloc_mw(mw);
		if (ret)
			die("ibv_dealloc_mw: %s", strerror(ret));
	}
	ret = ibv_dereg_mr(mr);
	if (ret)
		die("ibv_dereg_mr: %s", strerror(ret));
	ret = ibv_destroy_cq(cq);
	if (ret)
		die("ibv_destroy_cq: %s", strerror(ret));
	ret = ibv_dealloc_pd(pd);
	if (ret)
		die("ibv_dealloc_pd: %s", strerror(ret));
	ret = ibv_close_device(ctx);
	if (ret)
		die("ibv_close_device: %s", strerror(ret));
	ibv_free_device_list(dev_list);
	free(buf);
	return 0;
}
