/* One program, two kinds of device: a soft roxe device and a device of the
 * system library that roxe's drop-in passes through, used side by side.
 * Opens the FIRST and the LAST device of ibv_get_device_list (roxe lists
 * its own devices first), builds an RC QP on each, connects them to each
 * other by GID (index 0 on both) and sends a message each way, then an RDMA
 * WRITE from the last to the first. Prints "side by side: ok" and exits 0,
 * or names the failing step and exits 1.
 *
 *   cc side_by_side.c -o side_by_side -libverbs
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAIL(...) do { fprintf(stderr, "side by side: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define LEN 4096

struct end {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void open_end(struct ibv_device *dev, struct end *e)
{
	e->ctx = ibv_open_device(dev);
	if (!e->ctx) FAIL("ibv_open_device(%s)", ibv_get_device_name(dev));
	e->pd = ibv_alloc_pd(e->ctx);
	if (!e->pd) FAIL("ibv_alloc_pd");
	e->cq = ibv_create_cq(e->ctx, 16, NULL, NULL, 0);
	if (!e->cq) FAIL("ibv_create_cq");
	e->buf = calloc(1, LEN);
	e->mr = ibv_reg_mr(e->pd, e->buf, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!e->mr) FAIL("ibv_reg_mr");
	struct ibv_qp_init_attr ia = {
		.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	e->qp = ibv_create_qp(e->pd, &ia);
	if (!e->qp) FAIL("ibv_create_qp");
	if (ibv_query_gid(e->ctx, 1, 0, &e->gid)) FAIL("ibv_query_gid");
	struct ibv_port_attr pa;
	if (ibv_query_port(e->ctx, 1, &pa) || pa.state != IBV_PORT_ACTIVE) FAIL("ibv_query_port");
}

static void connect_to(struct end *e, struct end *peer)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		FAIL("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		FAIL("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		FAIL("RTS");
	struct ibv_qp_init_attr init;
	if (ibv_query_qp(e->qp, &a, IBV_QP_STATE, &init) || a.qp_state != IBV_QPS_RTS) FAIL("query_qp");
}

static struct ibv_wc wait_one(struct end *e, const char *what)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 10;
	int n;
	while ((n = ibv_poll_cq(e->cq, 1, &wc)) == 0)
		if (time(NULL) > end) FAIL("timeout waiting for %s", what);
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		FAIL("%s: %s", what, n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
	return wc;
}

static void send_msg(struct end *from, struct end *to, const char *msg)
{
	struct ibv_sge rs = { (uintptr_t)to->buf, LEN, to->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *bad_r;
	if (ibv_post_recv(to->qp, &rw, &bad_r)) FAIL("post_recv");
	strcpy(from->buf, msg);
	struct ibv_sge ss = { (uintptr_t)from->buf, (uint32_t)strlen(msg) + 1, from->mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad_s;
	if (ibv_post_send(from->qp, &sw, &bad_s)) FAIL("post_send");
	wait_one(from, "send completion");
	struct ibv_wc wc = wait_one(to, "receive");
	if (wc.byte_len != strlen(msg) + 1 || strcmp(to->buf, msg)) FAIL("received %s", to->buf);
}

int main(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 2) FAIL("need two devices, have %d", n);
	struct end a = { 0 }, b = { 0 };
	open_end(list[0], &a);
	open_end(list[n - 1], &b);
	printf("first: %s, last: %s\n", ibv_get_device_name(list[0]), ibv_get_device_name(list[n - 1]));
	connect_to(&a, &b);
	connect_to(&b, &a);
	send_msg(&a, &b, "from the first device");
	send_msg(&b, &a, "from the last device");
	strcpy(b.buf, "written by the last device");
	struct ibv_sge ws = { (uintptr_t)b.buf, 27, b.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 3, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)a.buf + 1024;
	w.wr.rdma.rkey = a.mr->rkey;
	if (ibv_post_send(b.qp, &w, &bad)) FAIL("post WRITE");
	wait_one(&b, "WRITE completion");
	for (int i = 0; i < 1000 && strcmp(a.buf + 1024, "written by the last device"); i++) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	if (strcmp(a.buf + 1024, "written by the last device")) FAIL("WRITE not seen");
	/* Importing each context through a dup of its cmd_fd: the soft one's
	 * here, the real one's by the system library (its verbs go there). */
	struct end *both[] = { &a, &b };
	for (int i = 0; i < 2; i++) {
		struct end *e = both[i];
		int fd = dup(e->ctx->cmd_fd);
		struct ibv_context *ic = fd >= 0 ? ibv_import_device(fd) : NULL;
		if (!ic) FAIL("ibv_import_device on %s: %s", ibv_get_device_name(e->ctx->device),
			      strerror(errno));
		struct ibv_pd *ipd = ibv_import_pd(ic, e->pd->handle);
		if (!ipd || ipd->handle != e->pd->handle || ipd->context != ic)
			FAIL("ibv_import_pd on %s: %s", ibv_get_device_name(e->ctx->device),
			     strerror(errno));
		struct ibv_mr *imr = ibv_import_mr(ipd, e->mr->handle);
		if (!imr || imr->lkey != e->mr->lkey || imr->rkey != e->mr->rkey)
			FAIL("ibv_import_mr on %s: %s", ibv_get_device_name(e->ctx->device),
			     strerror(errno));
		ibv_unimport_mr(imr);
		ibv_unimport_pd(ipd);
		if (ibv_close_device(ic)) FAIL("closing the imported context");
		printf("imported: %s\n", ibv_get_device_name(e->ctx->device));
	}
	struct end *ends[] = { &b, &a };
	for (int i = 0; i < 2; i++) {
		struct end *e = ends[i];
		if (ibv_destroy_qp(e->qp) || ibv_dereg_mr(e->mr) || ibv_destroy_cq(e->cq) ||
		    ibv_dealloc_pd(e->pd) || ibv_close_device(e->ctx))
			FAIL("teardown");
	}
	ibv_free_device_list(list);
	printf("side by side: ok\n");
	return 0;
}
