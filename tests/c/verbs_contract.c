/*
 * verbs_contract.c -- checks the libibverbs contract of the drop-in
 * libibverbs.so.1 (return conventions, errnos, completion channels, GIDs,
 * the ibv_wr_* API, immediate data) in ONE process on one device: two RC
 * QPs on the same device talk to each other over loopback.
 *
 * Written against the system <infiniband/verbs.h> only; what it expects is
 * what rdma-core's libibverbs with the rxe provider does (see
 * /work/shared/docs/libibverbs-abi.md sections 6 and 7).
 *
 * Prints "ok <name>" or "FAIL <name>: detail" per check and exits 1 if any
 * check failed (2 if the setup itself failed). Every wait is bounded: CQ
 * polls and poll(2) give up after 5 s, a watchdog ends the run after 25 s.
 *
 * A check where the drop-in is known to differ from real libibverbs/rxe
 * gets a "DEVIATION" comment (none at the time of writing).
 *
 *   build: cc -Wall -Werror -O2 -o verbs_contract verbs_contract.c -libverbs -pthread
 *   run:   LD_LIBRARY_PATH=target/debug/ibverbs ROXE_ADDR=127.0.201.1 ./verbs_contract
 *
 * Options: -d DEV (default: the first device), -a A.B.C.D (the device's
 * IPv4 address, for the GID check; default $ROXE_ADDR; without either the
 * GID is only checked to be IPv4-mapped).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 5000
#define BUF_SIZE 4096
#define CQ_SIZE 64

static int failures;

static void ok(const char *name)
{
	printf("ok %s\n", name);
	fflush(stdout);
}

static void fail(const char *name, const char *fmt, ...)
{
	va_list ap;

	printf("FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	failures++;
}

/* ok/FAIL by a condition; returns the condition. */
static int check(int cond, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (cond) {
		ok(name);
		return 1;
	}
	printf("FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	failures++;
	return 0;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	printf("FAIL setup: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(2);
}

static void watchdog(int sig)
{
	static const char msg[] = "FAIL watchdog: the run took longer than 25 s\n";
	ssize_t r;

	(void)sig;
	r = write(STDOUT_FILENO, msg, sizeof(msg) - 1);
	(void)r;
	_exit(1);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *gid_str(const union ibv_gid *g, char *buf, size_t len)
{
	if (!inet_ntop(AF_INET6, g->raw, buf, len))
		snprintf(buf, len, "?");
	return buf;
}

/* ------------------------------------------------------------------ */
/* Completions */

/*
 * Poll `cq` until `n` completions have been collected into `wc` or 5 s
 * passed. Returns the number collected (negative: ibv_poll_cq failed).
 */
static int poll_n_ms(struct ibv_cq *cq, struct ibv_wc *wc, int n, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;
	int got = 0;

	while (got < n) {
		int k = ibv_poll_cq(cq, n - got, wc + got);

		if (k < 0)
			return k;
		got += k;
		if (got >= n)
			break;
		if (now_ms() > deadline)
			break;
		if (k == 0)
			usleep(100);
	}
	return got;
}

static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	return poll_n_ms(cq, wc, n, TIMEOUT_MS);
}

/* The completion with `wr_id` among `n`, or NULL. */
static struct ibv_wc *find_wc(struct ibv_wc *wc, int n, uint64_t wr_id)
{
	for (int i = 0; i < n; i++)
		if (wc[i].wr_id == wr_id)
			return &wc[i];
	return NULL;
}

/*
 * Check one completion: present, successful, opcode, byte_len (if >= 0),
 * qp_num. Prints ok/FAIL under `name`.
 */
static int check_wc(const char *name, struct ibv_wc *wc, int n, uint64_t wr_id,
		    enum ibv_wc_opcode opcode, int byte_len, uint32_t qp_num)
{
	struct ibv_wc *w = find_wc(wc, n, wr_id);

	if (!w) {
		fail(name, "no completion with wr_id %" PRIu64 " (%d completions polled)",
		     wr_id, n);
		return 0;
	}
	if (w->status != IBV_WC_SUCCESS) {
		fail(name, "wr_id %" PRIu64 ": status %d (%s)", wr_id, w->status,
		     ibv_wc_status_str(w->status));
		return 0;
	}
	if (w->opcode != opcode) {
		fail(name, "wr_id %" PRIu64 ": opcode %d, expected %d", wr_id, w->opcode, opcode);
		return 0;
	}
	if (byte_len >= 0 && w->byte_len != (uint32_t)byte_len) {
		fail(name, "wr_id %" PRIu64 ": byte_len %u, expected %d", wr_id, w->byte_len,
		     byte_len);
		return 0;
	}
	if (w->qp_num != qp_num) {
		fail(name, "wr_id %" PRIu64 ": qp_num %u, expected %u", wr_id, w->qp_num, qp_num);
		return 0;
	}
	ok(name);
	return 1;
}

/* ------------------------------------------------------------------ */
/* Objects */

struct ctx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	struct ibv_port_attr port;
};

struct buf {
	char *p;
	struct ibv_mr *mr;
};

static void buf_init(struct ctx *c, struct buf *b)
{
	b->p = calloc(1, BUF_SIZE);
	if (!b->p)
		die("calloc");
	b->mr = ibv_reg_mr(c->pd, b->p, BUF_SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ);
	if (!b->mr)
		die("ibv_reg_mr: %s", strerror(errno));
}

static struct ibv_qp *make_qp(struct ctx *c, struct ibv_cq *scq, struct ibv_cq *rcq,
			      struct ibv_qp_cap *granted)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = { .max_send_wr = 32, .max_recv_wr = 32, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 0,
	};
	struct ibv_qp *qp = ibv_create_qp(c->pd, &ia);

	if (!qp)
		die("ibv_create_qp: %s", strerror(errno));
	if (granted)
		*granted = ia.cap;
	return qp;
}

/* An RC QP on `srq`, its completions to `cq`. */
static struct ibv_qp *make_srq_qp(struct ctx *c, struct ibv_cq *cq, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(c->pd, &ia);

	if (!qp)
		die("ibv_create_qp (srq): %s", strerror(errno));
	return qp;
}

/* ibv_destroy_qp in a thread of its own, and when it returned. */
struct destroyer {
	struct ibv_qp *qp;
	int rc;
	int done;
};

static void *destroy_in_thread(void *arg)
{
	struct destroyer *d = arg;

	d->rc = ibv_destroy_qp(d->qp);
	__atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ,
	};

	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static const int RTR_MASK = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

static struct ibv_qp_attr rtr_attr(struct ctx *c, uint32_t dest_qpn, uint32_t psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest_qpn,
		.rq_psn = psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = {
			.is_global = 1,
			.grh = { .dgid = c->gid, .sgid_index = 0, .hop_limit = 64 },
			.dlid = c->port.lid,
			.sl = 0,
			.src_path_bits = 0,
			.port_num = 1,
		},
	};

	return a;
}

static int to_rtr(struct ctx *c, struct ibv_qp *qp, uint32_t dest_qpn, uint32_t psn)
{
	struct ibv_qp_attr a = rtr_attr(c, dest_qpn, psn);

	return ibv_modify_qp(qp, &a, RTR_MASK);
}

static int to_rts(struct ibv_qp *qp, uint32_t psn)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTS,
		.timeout = 14,
		.retry_cnt = 7,
		.rnr_retry = 7,
		.sq_psn = psn,
		.max_rd_atomic = 1,
	};

	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/*
 * RESET -> INIT -> RTR -> RTS for both QPs, each pointing at the other.
 * `tag` names the pair; with `check_state`, qp->state is checked after
 * each transition.
 */
static void connect_pair(struct ctx *c, struct ibv_qp *a, struct ibv_qp *b, const char *tag,
			 int check_state)
{
	struct ibv_qp *qps[2] = { a, b };
	char name[96];
	int rc;

	for (int i = 0; i < 2; i++) {
		if ((rc = to_init(qps[i])))
			die("%s: modify_qp INIT: %s", tag, strerror(rc));
		if (check_state && i == 0) {
			snprintf(name, sizeof(name), "%s.qp_state_field_init", tag);
			check(qps[i]->state == IBV_QPS_INIT, name, "qp->state %d, expected %d",
			      qps[i]->state, IBV_QPS_INIT);
		}
	}
	for (int i = 0; i < 2; i++) {
		if ((rc = to_rtr(c, qps[i], qps[1 - i]->qp_num, 100 + 1000 * (1 - i))))
			die("%s: modify_qp RTR: %s", tag, strerror(rc));
		if (check_state && i == 0) {
			snprintf(name, sizeof(name), "%s.qp_state_field_rtr", tag);
			check(qps[i]->state == IBV_QPS_RTR, name, "qp->state %d, expected %d",
			      qps[i]->state, IBV_QPS_RTR);
		}
	}
	for (int i = 0; i < 2; i++) {
		if ((rc = to_rts(qps[i], 100 + 1000 * i)))
			die("%s: modify_qp RTS: %s", tag, strerror(rc));
		if (check_state && i == 0) {
			/* Checked before any ibv_query_qp: ibv_modify_qp itself
			 * must update the public field. */
			snprintf(name, sizeof(name), "%s.qp_state_field_rts", tag);
			check(qps[i]->state == IBV_QPS_RTS, name, "qp->state %d, expected %d",
			      qps[i]->state, IBV_QPS_RTS);
		}
	}
}

static int post_recv(struct ibv_qp *qp, uint64_t wr_id, struct buf *b, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(b->p + off), .length = len, .lkey = b->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;

	return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, uint64_t wr_id, struct buf *b, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(b->p + off), .length = len, .lkey = b->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	};
	struct ibv_send_wr *bad = NULL;

	return ibv_post_send(qp, &wr, &bad);
}

static void fill(char *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (char)(seed + i * 7);
}

/* The first offset where a and b differ, or -1. */
static long diff_at(const char *a, const char *b, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (a[i] != b[i])
			return (long)i;
	return -1;
}

/* ------------------------------------------------------------------ */
/* Blocking ibv_get_cq_event in a thread */

struct waiter {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	void *cq_context;
	int rc;
	int err;
};

static void *wait_event(void *arg)
{
	struct waiter *w = arg;

	w->rc = ibv_get_cq_event(w->ch, &w->cq, &w->cq_context);
	w->err = errno;
	return NULL;
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	const char *dev_name = NULL;
	const char *addr = getenv("ROXE_ADDR");
	struct ibv_device **list;
	struct ctx c = { 0 };
	int opt, num, rc;
	char gs[INET6_ADDRSTRLEN];

	while ((opt = getopt(argc, argv, "d:a:")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'a':
			addr = optarg;
			break;
		default:
			fprintf(stderr, "usage: %s [-d dev] [-a ipv4]\n", argv[0]);
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGALRM, watchdog);
	alarm(25);

	list = ibv_get_device_list(&num);
	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < num; i++) {
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) {
			c.ctx = ibv_open_device(list[i]);
			if (!c.ctx)
				die("ibv_open_device(%s): %s", ibv_get_device_name(list[i]),
				    strerror(errno));
			break;
		}
	}
	if (!c.ctx)
		die("device %s not found (%d devices)", dev_name ? dev_name : "(any)", num);
	printf("# device %s\n", ibv_get_device_name(c.ctx->device));
	/* A soft device has no kernel index: -1, as rdma-core answers for a
	 * device the kernel's RDMA netlink does not know (UCX then asks the
	 * kernel nothing about it). */
	check(ibv_get_device_index(c.ctx->device) == -1, "get_device_index.none",
	      "index %d, expected -1", ibv_get_device_index(c.ctx->device));
	c.pd = ibv_alloc_pd(c.ctx);
	if (!c.pd)
		die("ibv_alloc_pd: %s", strerror(errno));

	/* ---------------------------------------------------- port, GIDs */
	rc = ibv_query_port(c.ctx, 1, &c.port);
	if (rc)
		die("ibv_query_port: %s", strerror(rc));
	check(c.port.link_layer == IBV_LINK_LAYER_ETHERNET, "query_port.link_layer_ethernet",
	      "link_layer %d, expected %d", c.port.link_layer, IBV_LINK_LAYER_ETHERNET);
	check(c.port.state == IBV_PORT_ACTIVE, "query_port.state_active", "state %d, expected %d",
	      c.port.state, IBV_PORT_ACTIVE);
	check(c.port.gid_tbl_len >= 1, "query_port.gid_tbl_len", "gid_tbl_len %d",
	      c.port.gid_tbl_len);

	if (ibv_query_gid(c.ctx, 1, 0, &c.gid))
		die("ibv_query_gid(0): %s", strerror(errno));
	{
		static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
		struct in_addr want;

		if (memcmp(c.gid.raw, mapped, 12)) {
			fail("query_gid.index0", "%s is not IPv4-mapped",
			     gid_str(&c.gid, gs, sizeof(gs)));
		} else if (addr && inet_pton(AF_INET, addr, &want) == 1) {
			check(!memcmp(c.gid.raw + 12, &want, 4), "query_gid.index0",
			      "%s, expected ::ffff:%s", gid_str(&c.gid, gs, sizeof(gs)), addr);
		} else {
			ok("query_gid.index0");
			printf("# no ROXE_ADDR/-a: only checked that %s is IPv4-mapped\n",
			       gid_str(&c.gid, gs, sizeof(gs)));
		}
	}
	{
		/* Every index < gid_tbl_len answers (an empty slot: a zero GID);
		 * the first index past the table fails with -1. */
		int bad = -1;
		union ibv_gid g;

		for (int i = 0; i < c.port.gid_tbl_len && i < 1024; i++)
			if (ibv_query_gid(c.ctx, 1, i, &g)) {
				bad = i;
				break;
			}
		check(bad < 0, "query_gid.all_below_tbl_len", "ibv_query_gid(%d) failed: %s", bad,
		      strerror(errno));
		rc = ibv_query_gid(c.ctx, 1, c.port.gid_tbl_len, &g);
		check(rc == -1, "query_gid.past_tbl_len", "ibv_query_gid(gid_tbl_len=%d) returned %d",
		      c.port.gid_tbl_len, rc);
	}
	{
		struct ibv_gid_entry e;

		memset(&e, 0xa5, sizeof(e));
		rc = ibv_query_gid_ex(c.ctx, 1, 0, &e, 0);
		if (rc)
			fail("query_gid_ex.index0", "returned %d (%s)", rc, strerror(rc));
		else
			check(!memcmp(e.gid.raw, c.gid.raw, 16) && e.gid_index == 0 &&
				      e.port_num == 1 && e.gid_type == IBV_GID_TYPE_ROCE_V2,
			      "query_gid_ex.index0",
			      "gid %s index %u port %u type %u, expected %s index 0 port 1 type %d",
			      gid_str(&e.gid, gs, sizeof(gs)), e.gid_index, e.port_num, e.gid_type,
			      gid_str(&c.gid, (char[INET6_ADDRSTRLEN]){ 0 }, INET6_ADDRSTRLEN),
			      IBV_GID_TYPE_ROCE_V2);
	}
	{
		int n = c.port.gid_tbl_len > 0 ? c.port.gid_tbl_len : 1;
		struct ibv_gid_entry *t = calloc(n, sizeof(*t));
		ssize_t got;

		if (!t)
			die("calloc");
		got = ibv_query_gid_table(c.ctx, t, n, 0);
		if (got < 1 || got > n) {
			fail("query_gid_table", "returned %zd (gid_tbl_len %d)", got, n);
		} else {
			int bad = -1;

			for (ssize_t i = 0; i < got && bad < 0; i++) {
				union ibv_gid g;
				struct ibv_gid_entry e;

				if (t[i].port_num != 1 || t[i].gid_type != IBV_GID_TYPE_ROCE_V2 ||
				    (int)t[i].gid_index >= c.port.gid_tbl_len ||
				    ibv_query_gid(c.ctx, 1, t[i].gid_index, &g) ||
				    memcmp(g.raw, t[i].gid.raw, 16) ||
				    ibv_query_gid_ex(c.ctx, 1, t[i].gid_index, &e, 0) ||
				    memcmp(e.gid.raw, t[i].gid.raw, 16) || e.gid_type != t[i].gid_type)
					bad = (int)i;
			}
			if (bad >= 0)
				fail("query_gid_table", "entry %d (index %u, port %u, type %u, %s) "
				     "disagrees with ibv_query_gid/ibv_query_gid_ex or is not RoCE v2",
				     bad, t[bad].gid_index, t[bad].port_num, t[bad].gid_type,
				     gid_str(&t[bad].gid, gs, sizeof(gs)));
			else
				check(t[0].gid_index == 0 && !memcmp(t[0].gid.raw, c.gid.raw, 16),
				      "query_gid_table",
				      "first entry is index %u %s, expected index 0 %s",
				      t[0].gid_index, gid_str(&t[0].gid, gs, sizeof(gs)),
				      gid_str(&c.gid, (char[INET6_ADDRSTRLEN]){ 0 },
					      INET6_ADDRSTRLEN));
		}
		/* Too small a buffer: a negative errno, not a truncated table. */
		if (got > 1) {
			ssize_t r = ibv_query_gid_table(c.ctx, t, (size_t)got - 1, 0);

			check(r < 0, "query_gid_table.too_small", "returned %zd for max_entries %zd",
			      r, got - 1);
		}
		free(t);
	}

	/* ------------------------------------------- completion channel */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(c.ctx);
	static int cq_marker;
	struct ibv_cq *cq, *cq2;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_cap cap_a;
	struct buf ba, bb;
	struct ibv_wc wc[16];
	int n, flags;

	if (!ch)
		die("ibv_create_comp_channel: %s", strerror(errno));
	cq = ibv_create_cq(c.ctx, CQ_SIZE, &cq_marker, ch, 0);
	if (!cq)
		die("ibv_create_cq (channel): %s", strerror(errno));
	cq2 = ibv_create_cq(c.ctx, CQ_SIZE, NULL, NULL, 0);
	if (!cq2)
		die("ibv_create_cq: %s", strerror(errno));
	check(ch->refcnt == 1, "channel.refcnt", "refcnt %d with one CQ, expected 1", ch->refcnt);

	flags = fcntl(ch->fd, F_GETFL);
	if (flags < 0 || fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) < 0)
		die("fcntl O_NONBLOCK on channel->fd %d: %s", ch->fd, strerror(errno));
	{
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;

		errno = 0;
		rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
		check(rc == -1 && errno == EAGAIN, "channel.nonblock_eagain",
		      "ibv_get_cq_event returned %d errno %d (%s), expected -1 EAGAIN", rc, errno,
		      strerror(errno));
	}

	buf_init(&c, &ba);
	buf_init(&c, &bb);
	qa = make_qp(&c, cq, cq, &cap_a);
	qb = make_qp(&c, cq, cq, NULL);
	connect_pair(&c, qa, qb, "rc", 1);

	{
		struct ibv_qp_attr qa_attr;
		struct ibv_qp_init_attr qa_init;

		rc = ibv_query_qp(qa, &qa_attr, IBV_QP_STATE | IBV_QP_CAP, &qa_init);
		if (rc)
			fail("query_qp.rts", "ibv_query_qp returned %d (%s)", rc, strerror(rc));
		else
			check(qa_attr.qp_state == IBV_QPS_RTS && qa->state == IBV_QPS_RTS,
			      "query_qp.rts", "attr.qp_state %d, qp->state %d, expected %d",
			      qa_attr.qp_state, qa->state, IBV_QPS_RTS);
	}

	rc = ibv_req_notify_cq(cq, 0);
	check(rc == 0, "channel.req_notify", "ibv_req_notify_cq returned %d", rc);
	fill(ba.p, 256, 1);
	if ((rc = post_recv(qb, 1, &bb, 0, BUF_SIZE)))
		die("post_recv: %s", strerror(rc));
	if ((rc = post_send(qa, 2, &ba, 0, 256)))
		die("post_send: %s", strerror(rc));
	{
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;

		rc = poll(&pfd, 1, TIMEOUT_MS);
		if (check(rc == 1 && (pfd.revents & POLLIN), "channel.poll_pollin",
			  "poll returned %d revents 0x%x after 5 s", rc, pfd.revents)) {
			rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
			if (check(rc == 0 && ev_cq == cq && ev_ctx == &cq_marker,
				  "channel.get_cq_event",
				  "returned %d (errno %d) cq %p ctx %p, expected 0 cq %p ctx %p", rc,
				  errno, (void *)ev_cq, ev_ctx, (void *)cq, (void *)&cq_marker))
				ibv_ack_cq_events(cq, 1);
			check(cq->comp_events_completed == 1, "channel.ack_cq_events",
			      "comp_events_completed %u after one ack", cq->comp_events_completed);
		}
		n = poll_n(cq, wc, 2);
		check(n == 2, "channel.poll_cq_count", "%d completions after 5 s, expected 2", n);
		check_wc("channel.wc_send", wc, n, 2, IBV_WC_SEND, -1, qa->qp_num);
		check_wc("channel.wc_recv", wc, n, 1, IBV_WC_RECV, 256, qb->qp_num);
		check(diff_at(ba.p, bb.p, 256) < 0, "channel.recv_data", "byte %ld differs",
		      diff_at(ba.p, bb.p, 256));
		/* Nothing more pending: the notification was one-shot. */
		rc = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
		check(rc == -1 && errno == EAGAIN, "channel.one_shot",
		      "second ibv_get_cq_event returned %d errno %d, expected -1 EAGAIN", rc, errno);
	}

	/* Blocking ibv_get_cq_event in a second thread, woken by a completion. */
	if (fcntl(ch->fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
		die("fcntl clear O_NONBLOCK: %s", strerror(errno));
	{
		struct waiter w = { .ch = ch, .rc = -2 };
		pthread_t th;
		struct timespec until;

		rc = ibv_req_notify_cq(cq, 0);
		if (rc)
			die("ibv_req_notify_cq: %s", strerror(rc));
		if (pthread_create(&th, NULL, wait_event, &w))
			die("pthread_create");
		usleep(100 * 1000); /* let it block in ibv_get_cq_event */
		fill(ba.p, 300, 2);
		if ((rc = post_recv(qb, 3, &bb, 0, BUF_SIZE)))
			die("post_recv: %s", strerror(rc));
		if ((rc = post_send(qa, 4, &ba, 0, 300)))
			die("post_send: %s", strerror(rc));
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += TIMEOUT_MS / 1000;
		rc = pthread_timedjoin_np(th, NULL, &until);
		if (rc) {
			/* The thread is stuck in a blocking read: nothing can
			 * wake it; report and end the process. */
			fail("channel.blocking_thread", "not woken within 5 s (%s)", strerror(rc));
			printf("# giving up: %d failure(s)\n", failures);
			_exit(1);
		}
		if (check(w.rc == 0 && w.cq == cq && w.cq_context == &cq_marker,
			  "channel.blocking_thread",
			  "returned %d (errno %d) cq %p ctx %p, expected 0 cq %p ctx %p", w.rc, w.err,
			  (void *)w.cq, w.cq_context, (void *)cq, (void *)&cq_marker))
			ibv_ack_cq_events(cq, 1);
		n = poll_n(cq, wc, 2);
		check_wc("channel.blocking_wc_send", wc, n, 4, IBV_WC_SEND, -1, qa->qp_num);
		check_wc("channel.blocking_wc_recv", wc, n, 3, IBV_WC_RECV, 300, qb->qp_num);
	}

	/* --------------------------------------------------------- EBUSY */
	rc = ibv_destroy_comp_channel(ch);
	check(rc == EBUSY, "ebusy.destroy_comp_channel_with_cq", "returned %d (%s), expected EBUSY",
	      rc, strerror(rc));
	rc = ibv_dealloc_pd(c.pd);
	check(rc == EBUSY, "ebusy.dealloc_pd_with_mr", "returned %d (%s), expected EBUSY", rc,
	      strerror(rc));
	rc = ibv_destroy_cq(cq);
	check(rc == EBUSY, "ebusy.destroy_cq_with_qp", "returned %d (%s), expected EBUSY", rc,
	      strerror(rc));

	/* -------------------------------------------------------- errnos */
	{
		struct ibv_qp *qr = make_qp(&c, cq2, cq2, NULL);
		struct ibv_qp_attr a = rtr_attr(&c, qa->qp_num, 0);
		struct ibv_sge sge = { .addr = (uintptr_t)ba.p, .length = 8, .lkey = ba.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 50, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;

		rc = ibv_modify_qp(qr, &a, RTR_MASK);
		check(rc == EINVAL, "errno.modify_qp_reset_to_rtr",
		      "returned %d (%s), expected EINVAL", rc, strerror(rc));
		check(qr->state == IBV_QPS_RESET, "errno.modify_qp_reset_to_rtr_state_kept",
		      "qp->state %d after the failed modify, expected RESET", qr->state);

		rc = ibv_post_send(qr, &wr, &bad);
		check(rc == EINVAL && bad == &wr, "errno.post_send_reset_qp",
		      "returned %d (%s) bad_wr %p, expected EINVAL bad_wr %p", rc, strerror(rc),
		      (void *)bad, (void *)&wr);
		n = ibv_poll_cq(cq2, 16, wc);
		check(n == 0, "errno.post_send_reset_qp_no_cqe", "%d completions, expected 0", n);
		rc = ibv_destroy_qp(qr);
		check(rc == 0, "destroy_qp.reset", "returned %d", rc);
	}
	{
		/* num_sge > max_send_sge (the granted cap) on an RTS QP; the
		 * first WR of the list is good and must be posted. */
		int ns = (int)cap_a.max_send_sge + 1;
		struct ibv_sge *sges = calloc(ns, sizeof(*sges));
		struct ibv_sge one = { .addr = (uintptr_t)ba.p, .length = 16, .lkey = ba.mr->lkey };
		struct ibv_send_wr wr3, wr2, wr1;
		struct ibv_send_wr *bad = NULL;

		if (!sges)
			die("calloc");
		for (int i = 0; i < ns; i++)
			sges[i] = (struct ibv_sge){ .addr = (uintptr_t)(ba.p + 8 * i), .length = 8,
						    .lkey = ba.mr->lkey };
		/* A good WR after the bad one: never posted. */
		wr3 = (struct ibv_send_wr){ .wr_id = 62, .sg_list = &one, .num_sge = 1,
					    .opcode = IBV_WR_RDMA_WRITE,
					    .send_flags = IBV_SEND_SIGNALED };
		wr3.wr.rdma.remote_addr = (uintptr_t)bb.p + 2048;
		wr3.wr.rdma.rkey = bb.mr->rkey;
		wr2 = (struct ibv_send_wr){ .wr_id = 61, .sg_list = sges, .num_sge = ns,
					    .opcode = IBV_WR_RDMA_WRITE,
					    .send_flags = IBV_SEND_SIGNALED, .next = &wr3 };
		wr2.wr.rdma.remote_addr = (uintptr_t)bb.p;
		wr2.wr.rdma.rkey = bb.mr->rkey;
		wr1 = (struct ibv_send_wr){ .wr_id = 60, .sg_list = &one, .num_sge = 1,
					    .opcode = IBV_WR_RDMA_WRITE,
					    .send_flags = IBV_SEND_SIGNALED, .next = &wr2 };
		wr1.wr.rdma.remote_addr = (uintptr_t)bb.p + 2048;
		wr1.wr.rdma.rkey = bb.mr->rkey;
		rc = ibv_post_send(qa, &wr1, &bad);
		check(rc == EINVAL && bad == &wr2, "errno.post_send_too_many_sge",
		      "num_sge %d > max_send_sge %u: returned %d (%s) bad_wr %p, expected EINVAL "
		      "bad_wr %p (the second WR)",
		      ns, cap_a.max_send_sge, rc, strerror(rc), (void *)bad, (void *)&wr2);
		n = poll_n(cq, wc, 1);
		if (n == 1) {
			/* Anything else (the bad WR) would show up by now. */
			int k = poll_n_ms(cq, wc + 1, 1, 200);

			n += k > 0 ? k : 0;
		}
		check(n == 1 && wc[0].wr_id == 60 && wc[0].status == IBV_WC_SUCCESS &&
			      wc[0].opcode == IBV_WC_RDMA_WRITE,
		      "errno.post_send_too_many_sge_first_posted",
		      "%d completions (first wr_id %" PRIu64 " status %d opcode %d), expected "
		      "exactly wr_id 60 RDMA_WRITE",
		      n, n > 0 ? wc[0].wr_id : 0, n > 0 ? wc[0].status : -1,
		      n > 0 ? wc[0].opcode : -1);
		free(sges);
	}
	{
		/* A post list of 24 WRITEs of 64 bytes, each its own slice:
		 * all posted, all complete in order, all data lands. */
		enum { LIST = 24 };
		struct ibv_sge sges[LIST];
		struct ibv_send_wr wrs[LIST];
		struct ibv_send_wr *bad = NULL;
		int got = 0, in_order = 1;

		fill(ba.p, 64 * LIST, 77);
		memset(bb.p, 0, 64 * LIST);
		for (int i = 0; i < LIST; i++) {
			sges[i] = (struct ibv_sge){ .addr = (uintptr_t)(ba.p + 64 * i), .length = 64,
						    .lkey = ba.mr->lkey };
			wrs[i] = (struct ibv_send_wr){ .wr_id = 100 + i, .sg_list = &sges[i],
						       .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
						       .send_flags = IBV_SEND_SIGNALED,
						       .next = i + 1 < LIST ? &wrs[i + 1] : NULL };
			wrs[i].wr.rdma.remote_addr = (uintptr_t)(bb.p + 64 * i);
			wrs[i].wr.rdma.rkey = bb.mr->rkey;
		}
		rc = ibv_post_send(qa, wrs, &bad);
		check(rc == 0 && bad == NULL, "post_list.posted", "returned %d (%s) bad_wr %p", rc,
		      strerror(rc), (void *)bad);
		while (got < LIST) {
			int k = poll_n(cq, wc, 1);

			if (k != 1)
				break;
			in_order &= wc[0].wr_id == (uint64_t)(100 + got) &&
				    wc[0].status == IBV_WC_SUCCESS;
			got++;
		}
		check(got == LIST && in_order, "post_list.completions_in_order",
		      "%d of %d completions, in order and successful: %d", got, LIST, in_order);
		check(diff_at(ba.p, bb.p, 64 * LIST) < 0, "post_list.data",
		      "first difference at byte %ld", diff_at(ba.p, bb.p, 64 * LIST));
	}
	{
		/* A receive list (posted under one lock): the third WR has
		 * more SGEs than any QP takes, so it is bad_wr with EINVAL and
		 * the two before it are posted; two SENDs land in them in
		 * order. */
		enum { NS = 4096 };
		struct ibv_sge *many = calloc(NS, sizeof(*many));
		struct ibv_sge r1 = { .addr = (uintptr_t)(bb.p + 1024), .length = 64,
				      .lkey = bb.mr->lkey };
		struct ibv_sge r2 = { .addr = (uintptr_t)(bb.p + 1088), .length = 64,
				      .lkey = bb.mr->lkey };
		struct ibv_recv_wr w3 = { .wr_id = 403, .sg_list = many, .num_sge = NS };
		struct ibv_recv_wr w2 = { .wr_id = 402, .sg_list = &r2, .num_sge = 1, .next = &w3 };
		struct ibv_recv_wr w1 = { .wr_id = 401, .sg_list = &r1, .num_sge = 1, .next = &w2 };
		struct ibv_recv_wr *bad = NULL;

		if (!many)
			die("calloc");
		for (int i = 0; i < NS; i++)
			many[i] = (struct ibv_sge){ .addr = (uintptr_t)bb.p, .length = 1,
						    .lkey = bb.mr->lkey };
		rc = ibv_post_recv(qb, &w1, &bad);
		check(rc == EINVAL && bad == &w3, "post_recv_list.bad_wr",
		      "returned %d (%s) bad_wr %p, expected EINVAL bad_wr %p (the third WR)", rc,
		      strerror(rc), (void *)bad, (void *)&w3);
		fill(ba.p + 1024, 128, 91);
		if ((rc = post_send(qa, 404, &ba, 1024, 64)) || (rc = post_send(qa, 405, &ba, 1088, 64)))
			die("post_send: %s", strerror(rc));
		n = poll_n(cq, wc, 4);
		check(n == 4, "post_recv_list.completions", "%d completions, expected 4", n);
		{
			int first = -1, second = -1;

			for (int i = 0; i < n; i++) {
				if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 401)
					first = i;
				if (wc[i].opcode == IBV_WC_RECV && wc[i].wr_id == 402)
					second = i;
			}
			check(first >= 0 && second > first && wc[first].byte_len == 64 &&
				      wc[second].byte_len == 64,
			      "post_recv_list.in_order", "receives 401 at %d, 402 at %d", first,
			      second);
		}
		check(diff_at(ba.p + 1024, bb.p + 1024, 128) < 0, "post_recv_list.data",
		      "first difference at byte %ld", diff_at(ba.p + 1024, bb.p + 1024, 128));
		free(many);
	}
	{
		/* ATOMIC WRITE (IBV_WR_ATOMIC_WRITE, one 8-byte SGE): the 8
		 * bytes land at the remote address, nothing around them, and
		 * the completion says IBV_WC_ATOMIC_WRITE. */
		static const char word[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
		struct ibv_sge sge = { .addr = (uintptr_t)ba.p, .length = 8, .lkey = ba.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 300, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_ATOMIC_WRITE,
					  .send_flags = IBV_SEND_SIGNALED };
		struct ibv_send_wr *bad = NULL;
		char around[24];

		memcpy(ba.p, word, 8);
		memset(bb.p + 1024, 0x5a, 24);
		memset(around, 0x5a, 24);
		memcpy(around + 8, word, 8);
		wr.wr.rdma.remote_addr = (uintptr_t)(bb.p + 1032);
		wr.wr.rdma.rkey = bb.mr->rkey;
		rc = ibv_post_send(qa, &wr, &bad);
		check(rc == 0, "atomic_write.posted", "returned %d (%s)", rc, strerror(rc));
		n = rc == 0 ? poll_n(cq, wc, 1) : 0;
		check(n == 1 && wc[0].wr_id == 300 && wc[0].status == IBV_WC_SUCCESS &&
			      wc[0].opcode == IBV_WC_ATOMIC_WRITE,
		      "atomic_write.completion", "%d completions (status %d opcode %d)", n,
		      n > 0 ? wc[0].status : -1, n > 0 ? wc[0].opcode : -1);
		check(memcmp(bb.p + 1024, around, 24) == 0, "atomic_write.data",
		      "the 8 bytes at +8 of the 24 around them differ");
	}
	{
		char tmp[64];
		struct ibv_mr *mr;

		errno = 0;
		mr = ibv_reg_mr(c.pd, tmp, sizeof(tmp), IBV_ACCESS_REMOTE_WRITE);
		check(!mr && errno == EINVAL, "errno.reg_mr_remote_write_without_local_write",
		      "returned %p errno %d (%s), expected NULL EINVAL", (void *)mr, errno,
		      strerror(errno));
		if (mr)
			ibv_dereg_mr(mr);
		errno = 0;
		mr = ibv_reg_mr(c.pd, tmp, sizeof(tmp), IBV_ACCESS_REMOTE_ATOMIC);
		check(!mr && errno == EINVAL, "errno.reg_mr_remote_atomic_without_local_write",
		      "returned %p errno %d (%s), expected NULL EINVAL", (void *)mr, errno,
		      strerror(errno));
		if (mr)
			ibv_dereg_mr(mr);
	}
	{
		struct ibv_mw *mw;

		/* Types 1 and 2 exist (as on rxe); any other type is EINVAL. */
		errno = 0;
		mw = ibv_alloc_mw(c.pd, (enum ibv_mw_type)3);
		check(!mw && errno == EINVAL, "errno.alloc_mw_bad_type",
		      "returned %p errno %d (%s), expected NULL EINVAL", (void *)mw, errno,
		      strerror(errno));
		mw = ibv_alloc_mw(c.pd, IBV_MW_TYPE_1);
		check(mw && mw->type == IBV_MW_TYPE_1 && mw->pd == c.pd && mw->rkey != 0,
		      "errno.alloc_mw", "returned %p errno %d (%s)", (void *)mw, errno,
		      strerror(errno));
		if (mw) {
			/* libibverbs' own check: a type 2 window cannot be bound
			 * with ibv_bind_mw. */
			struct ibv_mw *mw2 = ibv_alloc_mw(c.pd, IBV_MW_TYPE_2);
			struct ibv_mw_bind bind = { .wr_id = 1 };

			check(mw2 && ibv_bind_mw(qa, mw2, &bind) == EINVAL,
			      "errno.bind_mw_type2", "type 2 window bound with ibv_bind_mw");
			check(!ibv_dealloc_mw(mw), "errno.dealloc_mw", "ibv_dealloc_mw failed");
			if (mw2)
				check(!ibv_dealloc_mw(mw2), "errno.dealloc_mw2",
				      "ibv_dealloc_mw failed");
		}
	}

	/* ------------------------------------------ RDMA WRITE with IMM */
	{
		const uint32_t imm = htonl(0x12345678);
		struct ibv_sge sge = { .addr = (uintptr_t)ba.p, .length = 512, .lkey = ba.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 70, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
					  .send_flags = IBV_SEND_SIGNALED, .imm_data = imm };
		struct ibv_send_wr *bad = NULL;
		struct ibv_wc *w;

		fill(ba.p, 512, 3);
		memset(bb.p, 0, BUF_SIZE);
		wr.wr.rdma.remote_addr = (uintptr_t)bb.p + 1024;
		wr.wr.rdma.rkey = bb.mr->rkey;
		/* The receive WR's buffer is not written: RDMA WRITE with IMM
		 * only consumes it. */
		if ((rc = post_recv(qb, 71, &bb, 0, 16)))
			die("post_recv: %s", strerror(rc));
		if ((rc = ibv_post_send(qa, &wr, &bad)))
			die("post_send RDMA_WRITE_WITH_IMM: %s", strerror(rc));
		n = poll_n(cq, wc, 2);
		check_wc("write_imm.wc_send_side", wc, n, 70, IBV_WC_RDMA_WRITE, -1, qa->qp_num);
		if (check_wc("write_imm.wc_recv_opcode", wc, n, 71, IBV_WC_RECV_RDMA_WITH_IMM, 512,
			     qb->qp_num)) {
			w = find_wc(wc, n, 71);
			check(w->wc_flags & IBV_WC_WITH_IMM, "write_imm.wc_flags_with_imm",
			      "wc_flags 0x%x", w->wc_flags);
			check(w->imm_data == imm, "write_imm.imm_data_byte_order",
			      "imm_data 0x%08x (ntohl 0x%08x), expected 0x%08x (htonl(0x12345678))",
			      w->imm_data, ntohl(w->imm_data), imm);
		}
		check(diff_at(ba.p, bb.p + 1024, 512) < 0, "write_imm.data", "byte %ld differs",
		      diff_at(ba.p, bb.p + 1024, 512));
	}
	{
		/* SEND with IMM: IBV_WC_RECV with the flag and the same bytes. */
		const uint32_t imm = htonl(0xa1b2c3d4);
		struct ibv_sge sge = { .addr = (uintptr_t)ba.p, .length = 64, .lkey = ba.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 72, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND_WITH_IMM,
					  .send_flags = IBV_SEND_SIGNALED, .imm_data = imm };
		struct ibv_send_wr *bad = NULL;
		struct ibv_wc *w;

		if ((rc = post_recv(qb, 73, &bb, 0, BUF_SIZE)))
			die("post_recv: %s", strerror(rc));
		if ((rc = ibv_post_send(qa, &wr, &bad)))
			die("post_send SEND_WITH_IMM: %s", strerror(rc));
		n = poll_n(cq, wc, 2);
		check_wc("send_imm.wc_send_side", wc, n, 72, IBV_WC_SEND, -1, qa->qp_num);
		if (check_wc("send_imm.wc_recv_opcode", wc, n, 73, IBV_WC_RECV, 64, qb->qp_num)) {
			w = find_wc(wc, n, 73);
			check((w->wc_flags & IBV_WC_WITH_IMM) && w->imm_data == imm,
			      "send_imm.imm_data", "wc_flags 0x%x imm_data 0x%08x, expected 0x%08x",
			      w->wc_flags, w->imm_data, imm);
		}
	}

	/* ----------------------------------------------------- ibv_qp_ex */
	check(ibv_qp_to_qp_ex(qa) == NULL, "qp_ex.to_qp_ex_null_for_create_qp",
	      "ibv_qp_to_qp_ex returned %p for an ibv_create_qp QP", (void *)ibv_qp_to_qp_ex(qa));
	{
		struct ibv_qp_init_attr_ex ia = {
			.send_cq = cq2,
			.recv_cq = cq2,
			.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
				 .max_recv_sge = 1, .max_inline_data = 64 },
			.qp_type = IBV_QPT_RC,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.pd = c.pd,
			.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
					  IBV_QP_EX_WITH_LOCAL_INV,
		};
		struct ibv_qp *qx, *qd;
		struct ibv_qp_ex *x;
		struct buf bx, bd;
		char inl[48];

		qx = ibv_create_qp_ex(c.ctx, &ia);
		if (!qx) {
			fail("qp_ex.create", "ibv_create_qp_ex returned NULL errno %d (%s)", errno,
			     strerror(errno));
			goto qp_ex_done;
		}
		ok("qp_ex.create");
		x = ibv_qp_to_qp_ex(qx);
		if (!check(x != NULL && &x->qp_base == qx, "qp_ex.to_qp_ex",
			   "ibv_qp_to_qp_ex returned %p for qp %p", (void *)x, (void *)qx)) {
			ibv_destroy_qp(qx);
			goto qp_ex_done;
		}
		qd = make_qp(&c, cq2, cq2, NULL);
		buf_init(&c, &bx);
		buf_init(&c, &bd);
		connect_pair(&c, qx, qd, "qp_ex", 0);
		fill(bx.p, 1000, 4);
		fill(inl, sizeof(inl), 5);
		if ((rc = post_recv(qd, 80, &bd, 2048, 1024)))
			die("post_recv: %s", strerror(rc));

		ibv_wr_start(x);
		x->wr_id = 81;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(x, bd.mr->rkey, (uintptr_t)bd.p);
		ibv_wr_set_sge(x, bx.mr->lkey, (uintptr_t)bx.p, 1000);
		x->wr_id = 82;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(x);
		ibv_wr_set_inline_data(x, inl, sizeof(inl));
		memset(inl, 0, sizeof(inl)); /* inline: copied by set_inline_data */
		rc = ibv_wr_complete(x);
		if (check(rc == 0, "qp_ex.wr_complete", "returned %d (%s)", rc, strerror(rc))) {
			char want[48];

			n = poll_n(cq2, wc, 3);
			check_wc("qp_ex.wc_rdma_write", wc, n, 81, IBV_WC_RDMA_WRITE, -1, qx->qp_num);
			check_wc("qp_ex.wc_send", wc, n, 82, IBV_WC_SEND, -1, qx->qp_num);
			check_wc("qp_ex.wc_recv", wc, n, 80, IBV_WC_RECV, (int)sizeof(want),
				 qd->qp_num);
			check(diff_at(bx.p, bd.p, 1000) < 0, "qp_ex.rdma_write_data",
			      "byte %ld differs", diff_at(bx.p, bd.p, 1000));
			fill(want, sizeof(want), 5);
			check(diff_at(want, bd.p + 2048, sizeof(want)) < 0,
			      "qp_ex.inline_send_data", "byte %ld differs",
			      diff_at(want, bd.p + 2048, sizeof(want)));
		}
		/* LOCAL_INV through the new API: of an ordinary MR's key it
		 * fails (only type 2 windows can be invalidated, as rxe's
		 * rxe_invalidate_mr refuses MRs that are not fast-registered). */
		ibv_wr_start(x);
		x->wr_id = 83;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(x, bd.mr->rkey);
		rc = ibv_wr_complete(x);
		if (check(rc == 0, "qp_ex.wr_local_inv", "returned %d (%s)", rc, strerror(rc))) {
			n = poll_n(cq2, wc, 1);
			check(n == 1 && wc[0].wr_id == 83 && wc[0].status == IBV_WC_LOC_QP_OP_ERR,
			      "qp_ex.wc_local_inv_refused", "%d completions, status %d", n,
			      n ? (int)wc[0].status : -1);
		}
		rc = ibv_destroy_qp(qx);
		rc |= ibv_destroy_qp(qd);
		rc |= ibv_dereg_mr(bx.mr);
		rc |= ibv_dereg_mr(bd.mr);
		check(rc == 0, "qp_ex.teardown", "a destroy returned nonzero");
		free(bx.p);
		free(bd.p);
	}
qp_ex_done:

	/* ------------------------------------------------ extended CQ */
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 64, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
		struct ibv_cq_ex *cx;
		struct ibv_qp *qs, *qr;
		struct ibv_poll_cq_attr pa = { 0 };
		struct buf bs, br;
		int seen_send = 0, seen_recv = 0, got = 0, in_order = 1, in_window = 1;
		uint64_t before_ns, after_ns, last_ts = 0;
		struct timespec wall;
		int64_t end;

		struct ibv_device_attr_ex dx;
		struct ibv_values_ex rt = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
		uint64_t rt_ns = 0;
		int same_clock = 1;

		/* The device clock: nanoseconds (hca_core_clock 1 GHz), 64 bits. */
		rc = ibv_query_device_ex(c.ctx, NULL, &dx);
		check(rc == 0 && dx.completion_timestamp_mask == UINT64_MAX &&
			      dx.hca_core_clock == 1000000,
		      "cq_ex.device_clock_attrs", "rc %d, mask %#" PRIx64 ", hca_core_clock %" PRIu64,
		      rc, dx.completion_timestamp_mask, dx.hca_core_clock);
		ca.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
		rc = ibv_query_rt_values_ex(c.ctx, &rt);
		clock_gettime(CLOCK_REALTIME, &wall);
		after_ns = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
		rt_ns = (uint64_t)rt.raw_clock.tv_nsec;
		check(rc == 0 && (rt.comp_mask & IBV_VALUES_MASK_RAW_CLOCK) &&
			      rt_ns + 50000000u >= after_ns && rt_ns <= after_ns + 50000000u,
		      "cq_ex.query_rt_values", "rc %d, comp_mask %u, clock %" PRIu64 " vs wall %" PRIu64,
		      rc, rt.comp_mask, rt_ns, after_ns);
		ca.wc_flags = IBV_WC_STANDARD_FLAGS;
		ca.cqe = 0;
		errno = 0;
		cx = ibv_create_cq_ex(c.ctx, &ca);
		check(cx == NULL && errno == EINVAL, "cq_ex.zero_cqe_einval",
		      "returned %p errno %d, expected NULL + EINVAL", (void *)cx, errno);
		ca.cqe = 64;
		/* Completion times on both clocks: when the device made each. */
		ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK |
			      IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
		cx = ibv_create_cq_ex(c.ctx, &ca);
		if (!check(cx != NULL, "cq_ex.create", "NULL errno %d (%s)", errno, strerror(errno)))
			goto cq_ex_done;
		check(ibv_start_poll(cx, &pa) == ENOENT, "cq_ex.empty_enoent",
		      "start_poll on an empty CQ did not return ENOENT");
		qs = make_qp(&c, ibv_cq_ex_to_cq(cx), ibv_cq_ex_to_cq(cx), NULL);
		qr = make_qp(&c, ibv_cq_ex_to_cq(cx), ibv_cq_ex_to_cq(cx), NULL);
		buf_init(&c, &bs);
		buf_init(&c, &br);
		connect_pair(&c, qs, qr, "cq_ex", 0);
		fill(bs.p, 300, 9);
		clock_gettime(CLOCK_REALTIME, &wall);
		before_ns = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
		if ((rc = post_recv(qr, 91, &br, 0, 1024)) || (rc = post_send(qs, 92, &bs, 0, 300)))
			die("cq_ex post: %s", strerror(rc));
		end = now_ms() + 5000;
		while (got < 2 && now_ms() < end) {
			if (ibv_start_poll(cx, &pa) != 0)
				continue;
			do {
				uint64_t ts = ibv_wc_read_completion_wallclock_ns(cx);

				same_clock &= ibv_wc_read_completion_ts(cx) == ts;

				clock_gettime(CLOCK_REALTIME, &wall);
				after_ns = (uint64_t)wall.tv_sec * 1000000000u + (uint64_t)wall.tv_nsec;
				/* 50 ms of slack: the device anchored its clock to
				 * the wall clock once, when it opened. */
				in_window &= ts + 50000000u >= before_ns && ts <= after_ns + 50000000u;
				in_order &= ts >= last_ts;
				last_ts = ts;
				got++;
				if (cx->wr_id == 92 && cx->status == IBV_WC_SUCCESS &&
				    ibv_wc_read_opcode(cx) == IBV_WC_SEND &&
				    ibv_wc_read_qp_num(cx) == qs->qp_num)
					seen_send = 1;
				if (cx->wr_id == 91 && cx->status == IBV_WC_SUCCESS &&
				    ibv_wc_read_opcode(cx) == IBV_WC_RECV &&
				    ibv_wc_read_byte_len(cx) == 300 &&
				    ibv_wc_read_qp_num(cx) == qr->qp_num &&
				    !(ibv_wc_read_wc_flags(cx) & IBV_WC_WITH_IMM))
					seen_recv = 1;
			} while (ibv_next_poll(cx) == 0);
			ibv_end_poll(cx);
		}
		check(seen_send, "cq_ex.send_completion", "no SEND completion read through cq_ex");
		check(seen_recv, "cq_ex.recv_completion", "no RECV completion read through cq_ex");
		check(got >= 2 && in_window, "cq_ex.wallclock_real",
		      "a completion's wall-clock time is not between the post and the poll");
		check(got >= 2 && in_order, "cq_ex.wallclock_monotonic",
		      "wall-clock completion times went backwards");
		check(got >= 2 && same_clock, "cq_ex.device_clock_is_nanoseconds",
		      "ibv_wc_read_completion_ts differs from the wall-clock nanoseconds");
		check(diff_at(bs.p, br.p, 300) < 0, "cq_ex.data", "byte %ld differs",
		      diff_at(bs.p, br.p, 300));
		rc = ibv_destroy_qp(qs);
		rc |= ibv_destroy_qp(qr);
		rc |= ibv_destroy_cq(ibv_cq_ex_to_cq(cx));
		rc |= ibv_dereg_mr(bs.mr);
		rc |= ibv_dereg_mr(br.mr);
		check(rc == 0, "cq_ex.teardown", "a destroy returned nonzero");
		free(bs.p);
		free(br.p);
	}
cq_ex_done:

	/* -------------------------------------------------- async events */
	{
		struct pollfd pfd = { .fd = c.ctx->async_fd, .events = POLLIN };
		struct ibv_cq *ecq = ibv_create_cq(c.ctx, CQ_SIZE, NULL, NULL, 0);
		struct ibv_qp_attr sqd = { .qp_state = IBV_QPS_SQD, .en_sqd_async_notify = 1 };
		struct ibv_qp_attr to_err = { .qp_state = IBV_QPS_ERR };
		struct ibv_srq_init_attr sia = { .attr = { .max_wr = 8, .max_sge = 1 } };
		struct ibv_async_event ev;
		struct ibv_qp *ea, *eb, *es;
		struct ibv_srq *srq;

		if (!ecq)
			die("ibv_create_cq (async): %s", strerror(errno));
		rc = poll(&pfd, 1, 0);
		check(rc == 0, "async.quiet_at_start", "poll returned %d, revents %#x", rc,
		      pfd.revents);

		/* SQD with en_sqd_async_notify: IBV_EVENT_SQ_DRAINED once the
		 * (idle) send queue has drained. */
		ea = make_qp(&c, ecq, ecq, NULL);
		eb = make_qp(&c, ecq, ecq, NULL);
		connect_pair(&c, ea, eb, "async", 0);
		rc = ibv_modify_qp(ea, &sqd, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
		check(rc == 0, "async.modify_to_sqd", "returned %d (%s)", rc, strerror(rc));
		rc = poll(&pfd, 1, TIMEOUT_MS);
		check(rc == 1 && (pfd.revents & POLLIN), "async.fd_readable_after_drain",
		      "poll returned %d, revents %#x", rc, pfd.revents);
		memset(&ev, 0, sizeof(ev));
		rc = rc == 1 ? ibv_get_async_event(c.ctx, &ev) : -1;
		check(rc == 0 && ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == ea,
		      "async.sq_drained", "rc %d, event %d (%s) for qp %p, expected SQ_DRAINED for %p",
		      rc, ev.event_type, ibv_event_type_str(ev.event_type), (void *)ev.element.qp,
		      (void *)ea);
		if (rc == 0) {
			ibv_ack_async_event(&ev);
			check(ea->events_completed == 1, "async.ack_counts_in_qp",
			      "events_completed %u, expected 1", ea->events_completed);
		}

		/* A QP on an SRQ going to ERR: IBV_EVENT_QP_LAST_WQE_REACHED. */
		srq = ibv_create_srq(c.pd, &sia);
		if (!srq)
			die("ibv_create_srq: %s", strerror(errno));
		es = make_srq_qp(&c, ecq, srq);
		/* RESET -> ERR is not a legal transition (the kernel's
		 * qp_state_table); INIT -> ERR is. */
		rc = to_init(es);
		check(rc == 0, "async.modify_srq_qp_to_init", "returned %d (%s)", rc, strerror(rc));
		rc = ibv_modify_qp(es, &to_err, IBV_QP_STATE);
		check(rc == 0, "async.modify_srq_qp_to_err", "returned %d (%s)", rc, strerror(rc));
		rc = poll(&pfd, 1, TIMEOUT_MS);
		memset(&ev, 0, sizeof(ev));
		rc = rc == 1 ? ibv_get_async_event(c.ctx, &ev) : -1;
		check(rc == 0 && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
			      ev.element.qp == es,
		      "async.last_wqe_reached",
		      "rc %d, event %d (%s) for qp %p, expected QP_LAST_WQE_REACHED for %p", rc,
		      ev.event_type, ibv_event_type_str(ev.event_type), (void *)ev.element.qp,
		      (void *)es);
		if (rc == 0)
			ibv_ack_async_event(&ev);
		rc = poll(&pfd, 1, 100);
		check(rc == 0, "async.nothing_more", "poll returned %d: an unexpected event", rc);

		/* An event whose QP is destroyed before the program reads it is
		 * dropped (the kernel drops a destroyed object's unread events):
		 * never handed out naming freed memory. */
		{
			struct ibv_qp *gone = make_srq_qp(&c, ecq, srq);
			int flags = fcntl(c.ctx->async_fd, F_GETFL);

			rc = to_init(gone) | ibv_modify_qp(gone, &to_err, IBV_QP_STATE);
			check(rc == 0, "async.unread.modify_to_err", "returned %d", rc);
			rc = poll(&pfd, 1, TIMEOUT_MS);
			check(rc == 1, "async.unread.event_written", "poll returned %d", rc);
			rc = ibv_destroy_qp(gone);
			check(rc == 0, "async.unread.destroy_does_not_wait", "returned %d", rc);
			fcntl(c.ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
			memset(&ev, 0, sizeof(ev));
			errno = 0;
			rc = ibv_get_async_event(c.ctx, &ev);
			check(rc == -1 && errno == EAGAIN, "async.unread.dropped",
			      "rc %d errno %d, event %d for qp %p (destroyed: %p)", rc, errno,
			      ev.event_type, (void *)ev.element.qp, (void *)gone);
			if (rc == 0)
				ibv_ack_async_event(&ev);
			fcntl(c.ctx->async_fd, F_SETFL, flags);
		}
		/* ibv_destroy_qp waits until every event handed out for the QP
		 * has been acknowledged (libibverbs' contract). */
		{
			struct destroyer d = { .qp = make_srq_qp(&c, ecq, srq) };
			pthread_t t;

			rc = to_init(d.qp) | ibv_modify_qp(d.qp, &to_err, IBV_QP_STATE);
			check(rc == 0, "async.ack_wait.modify_to_err", "returned %d", rc);
			rc = poll(&pfd, 1, TIMEOUT_MS);
			memset(&ev, 0, sizeof(ev));
			rc = rc == 1 ? ibv_get_async_event(c.ctx, &ev) : -1;
			check(rc == 0 && ev.element.qp == d.qp, "async.ack_wait.event",
			      "rc %d, event %d for qp %p, expected %p", rc, ev.event_type,
			      (void *)ev.element.qp, (void *)d.qp);
			if (pthread_create(&t, NULL, destroy_in_thread, &d) != 0)
				die("pthread_create");
			usleep(200 * 1000);
			check(!__atomic_load_n(&d.done, __ATOMIC_ACQUIRE), "async.ack_wait.destroy_waits",
			      "ibv_destroy_qp returned %d before the event was acknowledged", d.rc);
			if (rc == 0)
				ibv_ack_async_event(&ev);
			pthread_join(t, NULL);
			check(d.rc == 0, "async.ack_wait.destroy_after_ack", "returned %d", d.rc);
		}

		rc = ibv_destroy_qp(es) | ibv_destroy_qp(ea) | ibv_destroy_qp(eb);
		rc |= ibv_destroy_srq(srq) | ibv_destroy_cq(ecq);
		check(rc == 0, "async.teardown", "a destroy returned nonzero");
	}

	/* ----------------------------------------------------------- XRC */
	{
		/* An XRC domain shared through a file: a second open without
		 * O_CREAT finds it, O_EXCL refuses it; without one, no O_CREAT
		 * is EAGAIN (the kernel's rules). Its last close is EBUSY while
		 * an SRQ is in it; XRC_RECV QPs take no receives. */
		char path[] = "/tmp/roxe-xrcd-XXXXXX";
		int fd = mkstemp(path);
		struct ibv_xrcd_init_attr xa = {
			.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
			.fd = fd,
			.oflags = 0,
		};
		struct ibv_xrcd *x0 = ibv_open_xrcd(c.ctx, &xa);
		check(!x0 && errno == EAGAIN, "xrc.open_without_o_creat_is_eagain",
		      "returned %p, errno %d (%s), expected NULL and EAGAIN", (void *)x0, errno,
		      strerror(errno));
		xa.oflags = O_CREAT;
		struct ibv_xrcd *x1 = ibv_open_xrcd(c.ctx, &xa);
		xa.oflags = 0;
		struct ibv_xrcd *x2 = x1 ? ibv_open_xrcd(c.ctx, &xa) : NULL;
		xa.oflags = O_CREAT | O_EXCL;
		struct ibv_xrcd *x3 = x1 ? ibv_open_xrcd(c.ctx, &xa) : NULL;
		check(x1 && x2 && !x3 && errno == EINVAL, "xrc.open_shared_by_file",
		      "opens %p %p %p, errno %d (%s): expected two opens and EINVAL for O_EXCL",
		      (void *)x1, (void *)x2, (void *)x3, errno, strerror(errno));
		struct ibv_cq *xcq = ibv_create_cq(c.ctx, 16, NULL, NULL, 0);
		struct ibv_srq_init_attr_ex sa = {
			.attr = { .max_wr = 8, .max_sge = 1 },
			.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				     IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ,
			.srq_type = IBV_SRQT_XRC,
			.pd = c.pd,
			.xrcd = x1,
			.cq = xcq,
		};
		struct ibv_srq *xsrq = x1 && xcq ? ibv_create_srq_ex(c.ctx, &sa) : NULL;
		uint32_t srqn = 0;
		rc = xsrq ? ibv_get_srq_num(xsrq, &srqn) : -1;
		check(xsrq && rc == 0 && srqn != 0 && srqn < (1u << 24), "xrc.srq_and_its_number",
		      "srq %p, get_srq_num returned %d, number %u", (void *)xsrq, rc, srqn);
		struct ibv_qp_init_attr_ex qa_ex = {
			.qp_type = IBV_QPT_XRC_RECV,
			.comp_mask = IBV_QP_INIT_ATTR_XRCD,
			.xrcd = x1,
		};
		struct ibv_qp *tgt = x1 ? ibv_create_qp_ex(c.ctx, &qa_ex) : NULL;
		check(tgt && tgt->qp_type == IBV_QPT_XRC_RECV && !tgt->pd && !tgt->srq,
		      "xrc.recv_qp_created", "qp %p, errno %d (%s)", (void *)tgt, errno,
		      strerror(errno));
		if (tgt) {
			struct ibv_recv_wr rw = { .wr_id = 1 }, *bad = NULL;
			rc = ibv_post_recv(tgt, &rw, &bad);
			check(rc == EINVAL, "xrc.recv_qp_takes_no_receives",
			      "ibv_post_recv returned %d (%s), expected EINVAL", rc, strerror(rc));
			struct ibv_qp_attr qattr = {
				.qp_state = IBV_QPS_INIT,
				.pkey_index = 0,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
			};
			rc = ibv_modify_qp(tgt, &qattr,
					   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						   IBV_QP_ACCESS_FLAGS);
			struct ibv_qp_init_attr qinit;
			int qrc = ibv_query_qp(tgt, &qattr, IBV_QP_STATE, &qinit);
			check(rc == 0 && qrc == 0 && qattr.qp_state == IBV_QPS_INIT &&
				      qinit.qp_type == IBV_QPT_XRC_RECV,
			      "xrc.recv_qp_modify_query", "modify %d, query %d, state %d, type %d",
			      rc, qrc, qattr.qp_state, qinit.qp_type);
		}
		/* XRC_SEND: a send CQ and no receive CQ. */
		struct ibv_qp_init_attr_ex sa_ex = {
			.qp_type = IBV_QPT_XRC_SEND,
			.send_cq = xcq,
			.cap = { .max_send_wr = 4, .max_send_sge = 1 },
			.comp_mask = IBV_QP_INIT_ATTR_PD,
			.pd = c.pd,
		};
		struct ibv_qp *ini = ibv_create_qp_ex(c.ctx, &sa_ex);
		check(ini && ini->qp_type == IBV_QPT_XRC_SEND, "xrc.send_qp_created",
		      "qp %p, errno %d (%s)", (void *)ini, errno, strerror(errno));
		rc = x1 ? ibv_close_xrcd(x1) : -1;
		int rc2 = x2 ? ibv_close_xrcd(x2) : -1;
		check(rc == 0 && rc2 == EBUSY, "xrc.last_close_busy_while_in_use",
		      "closes returned %d and %d, expected 0 then EBUSY", rc, rc2);
		rc = (ini ? ibv_destroy_qp(ini) : 0) | (tgt ? ibv_destroy_qp(tgt) : 0);
		rc |= xsrq ? ibv_destroy_srq(xsrq) : 0;
		rc |= xcq ? ibv_destroy_cq(xcq) : 0;
		rc |= x2 ? ibv_close_xrcd(x2) : 0;
		check(rc == 0, "xrc.teardown", "a destroy or close returned nonzero");
		close(fd);
		unlink(path);
	}

	/* -------------------------------------------------- tag matching */
	{
		/* Tag-matching SRQs: the caps, creation rules, tag-list
		 * operations and their errnos (traffic: pyverbs' TM tests). */
		struct ibv_device_attr_ex ax;
		struct ibv_srq_init_attr_ex ta = {
			.attr = { .max_wr = 8, .max_sge = 1 },
			.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD |
				     IBV_SRQ_INIT_ATTR_TM,
			.srq_type = IBV_SRQT_TM,
			.pd = c.pd,
		};
		struct ibv_cq *tcq = ibv_create_cq(c.ctx, 16, NULL, NULL, 0);
		struct ibv_srq *tsrq = NULL;
		struct ibv_wc twc[2];
		char tbuf[64];

		memset(&ax, 0, sizeof(ax));
		rc = ibv_query_device_ex(c.ctx, NULL, &ax);
		check(rc == 0 && ax.tm_caps.max_num_tags > 0 &&
			      (ax.tm_caps.flags & IBV_TM_CAP_RC) &&
			      ax.tm_caps.max_rndv_hdr_size == 64 && ax.tm_caps.max_sge > 0,
		      "tm.caps", "rc %d: tags %u, flags %#x, rndv header %u, sge %u", rc,
		      ax.tm_caps.max_num_tags, ax.tm_caps.flags, ax.tm_caps.max_rndv_hdr_size,
		      ax.tm_caps.max_sge);
		ta.tm_cap.max_num_tags = 2;
		ta.tm_cap.max_ops = 4;
		errno = 0;
		tsrq = ibv_create_srq_ex(c.ctx, &ta);
		check(!tsrq && errno == EINVAL, "tm.create_without_cq_einval",
		      "srq %p, errno %d (%s)", (void *)tsrq, errno, strerror(errno));
		ta.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
		ta.cq = tcq;
		ta.tm_cap.max_num_tags = ax.tm_caps.max_num_tags + 1;
		errno = 0;
		tsrq = ibv_create_srq_ex(c.ctx, &ta);
		check(!tsrq && errno == EINVAL, "tm.create_too_many_tags_einval",
		      "srq %p, errno %d (%s)", (void *)tsrq, errno, strerror(errno));
		ta.tm_cap.max_num_tags = 2;
		tsrq = ibv_create_srq_ex(c.ctx, &ta);
		check(tsrq != NULL, "tm.create", "errno %d (%s)", errno, strerror(errno));
		if (tsrq && tcq) {
			struct ibv_sge tsge = { .addr = (uintptr_t)tbuf, .length = sizeof(tbuf),
						.lkey = ba.mr->lkey };
			struct ibv_ops_wr bad_wr = { .wr_id = 2, .opcode = 7 };
			struct ibv_ops_wr add = {
				.wr_id = 1,
				.next = &bad_wr,
				.opcode = IBV_WR_TAG_ADD,
				.flags = IBV_OPS_SIGNALED,
			};
			struct ibv_ops_wr *bad = NULL;

			/* tbuf is not in ba's MR, but tags are only checked
			 * when a message lands in them. */
			add.tm.add.recv_wr_id = 11;
			add.tm.add.sg_list = &tsge;
			add.tm.add.num_sge = 1;
			add.tm.add.tag = 0x42;
			add.tm.add.mask = ~0ull;
			rc = ibv_post_srq_ops(tsrq, &add, &bad);
			check(rc == EINVAL && bad == &bad_wr && add.tm.handle != 0,
			      "tm.ops_list_stops_at_unknown_opcode",
			      "returned %d, bad %p (expected %p), handle %u", rc, (void *)bad,
			      (void *)&bad_wr, add.tm.handle);
			n = poll_n(tcq, twc, 1);
			check(n == 1 && twc[0].wr_id == 1 && twc[0].opcode == IBV_WC_TM_ADD &&
				      twc[0].status == IBV_WC_SUCCESS,
			      "tm.add_completes_on_the_srq_cq", "%d completions, opcode %d, status %d",
			      n, n ? (int)twc[0].opcode : -1, n ? (int)twc[0].status : -1);
			add.next = NULL;
			add.flags = 0;
			rc = ibv_post_srq_ops(tsrq, &add, &bad);
			rc |= ibv_post_srq_ops(tsrq, &add, &bad) == ENOMEM ? 0 : 1;
			check(rc == 0, "tm.full_list_enomem", "a third tag in a list of 2 not ENOMEM");
			/* DEL of a handle that names no tag: TM_ERR, even unsignaled. */
			struct ibv_ops_wr del = { .wr_id = 3, .opcode = IBV_WR_TAG_DEL };

			del.tm.handle = 0xdead;
			rc = ibv_post_srq_ops(tsrq, &del, &bad);
			n = rc == 0 ? poll_n(tcq, twc, 1) : 0;
			check(n == 1 && twc[0].wr_id == 3 && twc[0].opcode == IBV_WC_TM_DEL &&
				      twc[0].status == IBV_WC_TM_ERR,
			      "tm.del_unknown_tm_err", "rc %d, %d completions, status %d (%s)", rc,
			      n, n ? (int)twc[0].status : -1,
			      n ? ibv_wc_status_str(twc[0].status) : "-");
			rc = ibv_destroy_cq(tcq);
			check(rc == EBUSY, "tm.cq_busy_while_srq_uses_it", "returned %d (%s)", rc,
			      strerror(rc));
			{
				struct ibv_qp_init_attr ia = { .send_cq = tcq, .recv_cq = tcq,
							       .srq = tsrq,
							       .cap = { .max_send_wr = 1,
									.max_send_sge = 1 },
							       .qp_type = IBV_QPT_UC };
				struct ibv_qp *uq = ibv_create_qp(c.pd, &ia);

				check(!uq && errno == EINVAL, "tm.uc_qp_refused",
				      "qp %p, errno %d (%s)", (void *)uq, errno, strerror(errno));
				if (uq)
					ibv_destroy_qp(uq);
			}
		}
		{
			struct ibv_srq_init_attr bsa = { .attr = { .max_wr = 2, .max_sge = 1 } };
			struct ibv_srq *basic = ibv_create_srq(c.pd, &bsa);
			struct ibv_ops_wr sync = { .wr_id = 4, .opcode = IBV_WR_TAG_SYNC,
						   .flags = IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC };
			struct ibv_ops_wr *bad = NULL;

			rc = basic ? ibv_post_srq_ops(basic, &sync, &bad) : -1;
			check(rc == EINVAL, "tm.ops_on_basic_srq_einval", "returned %d", rc);
			if (basic)
				ibv_destroy_srq(basic);
		}
		rc = tsrq ? ibv_destroy_srq(tsrq) : 0;
		rc |= tcq ? ibv_destroy_cq(tcq) : 0;
		check(rc == 0, "tm.teardown", "a destroy returned nonzero");
	}

	/* ------------------------------------------------------- imports */
	{
		/* A context imported through a dup of cmd_fd shares the
		 * objects, found by handle: QPs made with the imported PD
		 * WRITE with an imported MR into an MR of the original PD (one
		 * protection domain); deregistering through the imported struct
		 * revokes the keys for every struct; device memory is shared;
		 * handles that name nothing give ENOENT. */
		int fd = dup(c.ctx->cmd_fd);
		struct ibv_context *ic = fd >= 0 ? ibv_import_device(fd) : NULL;

		check(ic != NULL && ic->cmd_fd == fd, "import.device",
		      "fd %d: context %p (cmd_fd %d), errno %d (%s)", fd, (void *)ic,
		      ic ? ic->cmd_fd : -1, errno, strerror(errno));
		errno = 0;
		{
			int nfd = open("/dev/null", O_RDWR);
			struct ibv_context *bad = nfd >= 0 ? ibv_import_device(nfd) : NULL;

			check(!bad && errno == EOPNOTSUPP, "import.device_of_another_file",
			      "context %p, errno %d (%s), expected NULL and EOPNOTSUPP",
			      (void *)bad, errno, strerror(errno));
			if (nfd >= 0)
				close(nfd);
		}
		if (ic) {
			struct ibv_pd *ipd = ibv_import_pd(ic, c.pd->handle);
			struct buf src = { 0 }, dst = { 0 };
			struct ibv_mr *imr = NULL;

			check(ipd && ipd->handle == c.pd->handle && ipd->context == ic, "import.pd",
			      "pd %p for handle %u, errno %d (%s)", (void *)ipd, c.pd->handle,
			      errno, strerror(errno));
			errno = 0;
			struct ibv_pd *none = ibv_import_pd(ic, 0xfffffff0u);
			check(!none && errno == ENOENT, "import.unknown_handle_enoent",
			      "pd %p, errno %d (%s)", (void *)none, errno, strerror(errno));
			buf_init(&c, &src);
			buf_init(&c, &dst);
			if (ipd)
				imr = ibv_import_mr(ipd, src.mr->handle);
			check(imr && imr->lkey == src.mr->lkey && imr->rkey == src.mr->rkey &&
				      imr->length == BUF_SIZE && imr->pd == ipd &&
				      imr->handle == src.mr->handle,
			      "import.mr", "mr %p, errno %d (%s)", (void *)imr, errno,
			      strerror(errno));
			struct ibv_cq *icq = ibv_create_cq(ic, 16, NULL, NULL, 0);
			struct ibv_qp *ix = NULL, *iy = NULL;

			if (icq && ipd && imr) {
				struct ibv_qp_init_attr ia = {
					.send_cq = icq,
					.recv_cq = icq,
					.cap = { .max_send_wr = 8, .max_recv_wr = 8,
						 .max_send_sge = 1, .max_recv_sge = 1 },
					.qp_type = IBV_QPT_RC,
				};
				ix = ibv_create_qp(ipd, &ia);
				iy = ibv_create_qp(ipd, &ia);
			}
			check(ix && iy, "import.qps_on_imported_pd", "errno %d (%s)", errno,
			      strerror(errno));
			if (ix && iy) {
				struct ibv_sge sge = { .addr = (uintptr_t)src.p, .length = 4096,
						       .lkey = imr->lkey };
				struct ibv_send_wr wr = { .wr_id = 901, .sg_list = &sge,
							  .num_sge = 1,
							  .opcode = IBV_WR_RDMA_WRITE,
							  .send_flags = IBV_SEND_SIGNALED };
				struct ibv_send_wr *bad = NULL;
				struct ibv_wc iwc[2];

				connect_pair(&c, ix, iy, "import", 0);
				fill(src.p, 4096, 91);
				wr.wr.rdma.remote_addr = (uintptr_t)dst.p;
				wr.wr.rdma.rkey = dst.mr->rkey;
				rc = ibv_post_send(ix, &wr, &bad);
				n = rc == 0 ? poll_n(icq, iwc, 1) : 0;
				check(n == 1 && iwc[0].status == IBV_WC_SUCCESS &&
					      diff_at(src.p, dst.p, 4096) < 0,
				      "import.write_with_imported_keys",
				      "post %d, %d completions (status %d), first difference at %ld",
				      rc, n, n ? iwc[0].status : -1, diff_at(src.p, dst.p, 4096));
				/* Deregistered through the import: the original
				 * struct's rkey is refused. */
				rc = ibv_dereg_mr(imr);
				imr = NULL;
				memset(src.p, 0, 4096);
				sge = (struct ibv_sge){ .addr = (uintptr_t)dst.p, .length = 64,
							.lkey = dst.mr->lkey };
				wr.wr.rdma.remote_addr = (uintptr_t)src.p;
				wr.wr.rdma.rkey = src.mr->rkey;
				wr.wr_id = 902;
				rc |= ibv_post_send(ix, &wr, &bad);
				n = rc == 0 ? poll_n(icq, iwc, 1) : 0;
				check(n == 1 && iwc[0].status == IBV_WC_REM_ACCESS_ERR &&
					      src.p[0] == 0,
				      "import.dereg_through_import_revokes_keys",
				      "rc %d, %d completions (status %d %s), byte %d",
				      rc, n, n ? iwc[0].status : -1,
				      n ? ibv_wc_status_str(iwc[0].status) : "-", src.p[0]);
			}
			rc = (ix ? ibv_destroy_qp(ix) : 0) | (iy ? ibv_destroy_qp(iy) : 0);
			rc |= icq ? ibv_destroy_cq(icq) : 0;
			if (imr)
				ibv_unimport_mr(imr);
			/* The original struct of a region deregistered elsewhere
			 * is freed; the other MR is the original's to free. */
			rc |= ibv_dereg_mr(src.mr) | ibv_dereg_mr(dst.mr);
			free(src.p);
			free(dst.p);

			struct ibv_alloc_dm_attr da = { .length = 256 };
			struct ibv_dm *dm = ibv_alloc_dm(c.ctx, &da);
			struct ibv_dm *idm = dm ? ibv_import_dm(ic, dm->handle) : NULL;
			char out[256], in[256];

			fill(out, sizeof(out), 92);
			memset(in, 0, sizeof(in));
			if (dm && idm) {
				rc |= ibv_memcpy_to_dm(dm, 0, out, sizeof(out));
				rc |= ibv_memcpy_from_dm(in, idm, 0, sizeof(in));
			}
			check(dm && idm && memcmp(in, out, sizeof(in)) == 0, "import.dm",
			      "dm %p, imported %p, data %s", (void *)dm, (void *)idm,
			      memcmp(in, out, sizeof(in)) ? "differs" : "equal");
			if (idm)
				ibv_unimport_dm(idm);
			rc |= dm ? ibv_free_dm(dm) : 0;
			if (ipd)
				ibv_unimport_pd(ipd);
			rc |= ibv_close_device(ic);
			check(rc == 0, "import.teardown", "a destroy or close returned nonzero");
			/* The original context and its PD are untouched. */
			check(fcntl(c.ctx->cmd_fd, F_GETFD) >= 0 && fcntl(fd, F_GETFD) < 0,
			      "import.close_closes_only_the_imported_fd",
			      "original fd %s, imported fd %s",
			      fcntl(c.ctx->cmd_fd, F_GETFD) >= 0 ? "open" : "closed",
			      fcntl(fd, F_GETFD) >= 0 ? "open" : "closed");
		}
	}

	/* ------------------------------------------------------ teardown */
	rc = ibv_destroy_qp(qa);
	check(rc == 0, "teardown.destroy_qp", "returned %d (%s)", rc, strerror(rc));
	rc = ibv_destroy_cq(cq);
	check(rc == EBUSY, "ebusy.destroy_cq_with_one_of_two_qps",
	      "returned %d (%s) while qp b still uses it, expected EBUSY", rc, strerror(rc));
	rc = ibv_destroy_qp(qb);
	check(rc == 0, "teardown.destroy_qp2", "returned %d (%s)", rc, strerror(rc));
	rc = ibv_destroy_comp_channel(ch);
	check(rc == EBUSY, "ebusy.destroy_comp_channel_after_qps",
	      "returned %d (%s) while the CQ still exists, expected EBUSY", rc, strerror(rc));
	rc = ibv_destroy_cq(cq);
	check(rc == 0, "teardown.destroy_cq", "returned %d (%s)", rc, strerror(rc));
	check(ch->refcnt == 0, "teardown.channel_refcnt", "refcnt %d after its CQ went",
	      ch->refcnt);
	rc = ibv_destroy_comp_channel(ch);
	check(rc == 0, "teardown.destroy_comp_channel", "returned %d (%s)", rc, strerror(rc));
	rc = ibv_destroy_cq(cq2);
	check(rc == 0, "teardown.destroy_cq2", "returned %d (%s)", rc, strerror(rc));
	rc = ibv_dereg_mr(ba.mr);
	rc |= ibv_dereg_mr(bb.mr);
	check(rc == 0, "teardown.dereg_mr", "a dereg returned nonzero");
	rc = ibv_dealloc_pd(c.pd);
	check(rc == 0, "teardown.dealloc_pd", "returned %d (%s)", rc, strerror(rc));
	rc = ibv_close_device(c.ctx);
	check(rc == 0, "teardown.close_device", "returned %d (%s)", rc, strerror(rc));
	ibv_free_device_list(list);
	free(ba.p);
	free(bb.p);

	if (failures) {
		printf("# %d check(s) FAILED\n", failures);
		return 1;
	}
	printf("# all checks passed\n");
	return 0;
}
