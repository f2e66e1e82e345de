/*
 * The drop-in librdmacm.so.1 as a C program sees it, one process and one
 * device connecting to itself: rdma_getaddrinfo, rdma_get_devices,
 * rdma_event_str, a non-blocking channel (EAGAIN), REJECTED when nobody
 * listens, EINVAL for too much private data, a bind to an address of no
 * device, reject with private data, accept with rdma_init_qp_attr and the
 * rdma_verbs.h helpers, disconnect (QP to ERR), rdma_destroy_id blocking
 * while an event is unacknowledged, UD through SIDR, rdma_set_option,
 * rdma_migrate_id (to another channel, then synchronous) and
 * rdma_create_srq.
 *
 * Usage: rdmacm_edges ADDR PORT (ADDR: this process's roxe device, as
 * ROXE_ADDR). Prints "ok <check>" per check; exits 0 only if all pass.
 */
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

static const char *addr;
static int port;

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, \
				#cond);                                      \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, " (errno %d %s)\n", errno,           \
				strerror(errno));                            \
			exit(1);                                             \
		}                                                            \
	} while (0)

static struct sockaddr_in sin_of(const char *ip, int p)
{
	struct sockaddr_in s;

	memset(&s, 0, sizeof(s));
	s.sin_family = AF_INET;
	s.sin_port = htons(p);
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* The next event on ch within timeout_ms, which must be `want`. */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch,
				    enum rdma_cm_event_type want, int timeout_ms)
{
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	/* The channel is non-blocking: a wake-up for an event of an id
	 * destroyed since reads as EAGAIN; wait again. */
	for (;;) {
		CHECK(poll(&pfd, 1, timeout_ms) == 1, "no event within %d ms (wanted %s)",
		      timeout_ms, rdma_event_str(want));
		if (rdma_get_cm_event(ch, &ev) == 0)
			break;
		CHECK(errno == EAGAIN, "rdma_get_cm_event");
	}
	CHECK(ev->event == want, "got %s (status %d), wanted %s",
	      rdma_event_str(ev->event), ev->status, rdma_event_str(want));
	return ev;
}

static void ack(struct rdma_cm_event *ev)
{
	CHECK(rdma_ack_cm_event(ev) == 0, "rdma_ack_cm_event");
}

/* An RC (or UD) id on ch resolved to ADDR:p, with a QP. */
static struct rdma_cm_id *connector(struct rdma_event_channel *ch, int p,
				    enum rdma_port_space ps, int with_qp)
{
	struct sockaddr_in dst = sin_of(addr, p);
	struct ibv_qp_init_attr init;
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(ch, &id, NULL, ps) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0,
	      "rdma_resolve_addr");
	ack(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 2000));
	CHECK(id->verbs != NULL, "id->verbs after ADDR_RESOLVED");
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	ack(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 2000));
	if (with_qp) {
		memset(&init, 0, sizeof(init));
		init.qp_type = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
		init.cap.max_send_wr = init.cap.max_recv_wr = 8;
		init.cap.max_send_sge = init.cap.max_recv_sge = 1;
		init.sq_sig_all = 1;
		CHECK(rdma_create_qp(id, NULL, &init) == 0, "rdma_create_qp");
		CHECK(id->qp && id->send_cq && id->recv_cq && id->pd,
		      "rdma_create_qp fills qp, CQs and pd");
	}
	return id;
}

static struct rdma_cm_id *listener(struct rdma_event_channel *ch, int p,
				   enum rdma_port_space ps, void *context)
{
	struct sockaddr_in me = sin_of(addr, p);
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(ch, &id, context, ps) == 0, "rdma_create_id");
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&me) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(id, 8) == 0, "rdma_listen");
	CHECK(ntohs(rdma_get_src_port(id)) == p, "rdma_get_src_port");
	return id;
}

struct destroyer {
	struct rdma_cm_id *id;
	volatile int done;
};

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;

	CHECK(rdma_destroy_id(d->id) == 0, "rdma_destroy_id");
	d->done = 1;
	return NULL;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *l, *c, *child, *bad;
	struct rdma_conn_param param;
	struct ibv_context **devs;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	struct ibv_wc wc;
	struct ibv_mr *smr, *rmr;
	struct sockaddr_in nowhere;
	char big[64], pd[16], sbuf[32], rbuf[32];
	char portstr[16];
	int n, mask, ctx_marker;

	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
		return 2;
	}
	addr = argv[1];
	port = atoi(argv[2]);

	/* rdma_getaddrinfo: a destination, TCP port space, RC. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_port_space = RDMA_PS_TCP;
	snprintf(portstr, sizeof(portstr), "%d", port);
	CHECK(rdma_getaddrinfo(addr, portstr, &hints, &res) == 0, "rdma_getaddrinfo");
	CHECK(res->ai_dst_addr && res->ai_dst_len == sizeof(struct sockaddr_in),
	      "ai_dst_addr");
	CHECK(ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port) == port,
	      "ai_dst_addr port");
	CHECK(res->ai_qp_type == IBV_QPT_RC && res->ai_port_space == RDMA_PS_TCP,
	      "qp type %d, port space %d", res->ai_qp_type, res->ai_port_space);
	rdma_freeaddrinfo(res);
	printf("ok rdma_getaddrinfo\n");

	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED),
		     "RDMA_CM_EVENT_ESTABLISHED") == 0, "rdma_event_str");
	devs = rdma_get_devices(&n);
	CHECK(devs && n >= 1 && devs[n] == NULL, "rdma_get_devices: %d", n);
	CHECK(ibv_get_device_name(devs[0]->device) != NULL, "device name");
	rdma_free_devices(devs);
	printf("ok rdma_get_devices\n");

	/* A non-blocking channel with nothing pending: EAGAIN. */
	ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0, "fcntl");
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "EAGAIN");
	printf("ok nonblocking channel\n");

	/* A bind to an address no device can take. */
	CHECK(rdma_create_id(ch, &bad, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	nowhere = sin_of("192.0.2.1", port);
	errno = 0;
	CHECK(rdma_bind_addr(bad, (struct sockaddr *)&nowhere) == -1 &&
		      (errno == EADDRNOTAVAIL || errno == ENODEV),
	      "bind 192.0.2.1");
	CHECK(rdma_destroy_id(bad) == 0, "rdma_destroy_id");
	printf("ok bind to a foreign address\n");

	/* Nobody listens: REJECTED, reason 8 (invalid service ID). */
	c = connector(ch, port + 1, RDMA_PS_TCP, 1);
	memset(&param, 0, sizeof(param));
	param.private_data = big;
	param.private_data_len = 57;
	errno = 0;
	CHECK(rdma_connect(c, &param) == -1 && errno == EINVAL,
	      "57 bytes of private data");
	printf("ok too much private data\n");
	param.private_data_len = 0;
	param.responder_resources = param.initiator_depth = 1;
	param.retry_count = param.rnr_retry_count = 7;
	CHECK(rdma_connect(c, &param) == 0, "rdma_connect");
	ev = expect(ch, RDMA_CM_EVENT_REJECTED, 5000);
	CHECK(ev->status == 8, "REJ reason %d", ev->status);
	ack(ev);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0, "rdma_destroy_id");
	printf("ok rejected when nobody listens\n");

	/* Reject with private data. */
	l = listener(ch, port, RDMA_PS_TCP, &ctx_marker);
	c = connector(ch, port, RDMA_PS_TCP, 1);
	strcpy(pd, "hello");
	param.private_data = pd;
	param.private_data_len = 6;
	CHECK(rdma_connect(c, &param) == 0, "rdma_connect");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 5000);
	CHECK(ev->listen_id == l && ev->id != l, "listen_id and new id");
	CHECK(ev->id->context == &ctx_marker, "the new id inherits the context");
	CHECK(ev->id->verbs == l->verbs, "one shared context per device");
	CHECK(ev->param.conn.private_data_len >= 6 &&
		      memcmp(ev->param.conn.private_data, "hello", 6) == 0,
	      "the REQ's private data");
	child = ev->id;
	CHECK(rdma_reject(child, "no thanks", 10) == 0, "rdma_reject");
	ack(ev);
	ev = expect(ch, RDMA_CM_EVENT_REJECTED, 5000);
	CHECK(ev->id == c && ev->status == 28, "REJ reason %d", ev->status);
	CHECK(ev->param.conn.private_data_len >= 10 &&
		      memcmp(ev->param.conn.private_data, "no thanks", 10) == 0,
	      "the REJ's private data");
	ack(ev);
	CHECK(rdma_destroy_id(child) == 0, "rdma_destroy_id");
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0, "rdma_destroy_id");
	printf("ok reject with private data\n");

	/* Accept; data through the rdma_verbs.h helpers; disconnect. */
	c = connector(ch, port, RDMA_PS_TCP, 1);
	CHECK(rdma_connect(c, &param) == 0, "rdma_connect");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 5000);
	child = ev->id;
	ack(ev);
	memset(&qinit, 0, sizeof(qinit));
	qinit.qp_type = IBV_QPT_RC;
	qinit.cap.max_send_wr = qinit.cap.max_recv_wr = 8;
	qinit.cap.max_send_sge = qinit.cap.max_recv_sge = 1;
	qinit.sq_sig_all = 1;
	CHECK(rdma_create_qp(child, NULL, &qinit) == 0, "rdma_create_qp (passive)");
	memset(&qattr, 0, sizeof(qattr));
	qattr.qp_state = IBV_QPS_RTR;
	CHECK(rdma_init_qp_attr(child, &qattr, &mask) == 0, "rdma_init_qp_attr RTR");
	CHECK((mask & IBV_QP_DEST_QPN) && qattr.dest_qp_num == c->qp->qp_num,
	      "RTR attributes name the peer's QP");
	rmr = rdma_reg_msgs(child, rbuf, sizeof(rbuf));
	CHECK(rmr, "rdma_reg_msgs");
	CHECK(rdma_post_recv(child, NULL, rbuf, sizeof(rbuf), rmr) == 0, "rdma_post_recv");
	CHECK(rdma_accept(child, NULL) == 0, "rdma_accept");
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
	CHECK(ev->id == c, "active side established first");
	ack(ev);
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
	CHECK(ev->id == child, "passive side established");
	ack(ev);
	CHECK(c->qp->state == IBV_QPS_RTS, "the active QP is in RTS (%d)", c->qp->state);
	strcpy(sbuf, "through rdma_post_send");
	smr = rdma_reg_msgs(c, sbuf, sizeof(sbuf));
	CHECK(smr, "rdma_reg_msgs");
	CHECK(rdma_post_send(c, NULL, sbuf, sizeof(sbuf), smr, 0) == 0, "rdma_post_send");
	CHECK(rdma_get_send_comp(c, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
	      "send completion");
	CHECK(rdma_get_recv_comp(child, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
		      wc.byte_len == sizeof(sbuf),
	      "receive completion");
	CHECK(strcmp(rbuf, "through rdma_post_send") == 0, "received data");
	printf("ok accept and rdma_verbs.h data path\n");
	/* rdma_notify: COMM_EST (data before the RTU) is what the CM takes;
	 * any other QP event is EINVAL, as the kernel's ib_cm_notify answers. */
	CHECK(rdma_notify(child, IBV_EVENT_COMM_EST) == 0, "rdma_notify COMM_EST");
	errno = 0;
	CHECK(rdma_notify(child, IBV_EVENT_SQ_DRAINED) == -1 && errno == EINVAL,
	      "rdma_notify SQ_DRAINED: EINVAL (errno %d)", errno);
	printf("ok rdma_notify\n");

	CHECK(rdma_disconnect(child) == 0, "rdma_disconnect");
	ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED, 5000);
	CHECK(ev->id == c, "the peer sees DISCONNECTED");
	ack(ev);
	CHECK(rdma_disconnect(c) == 0, "rdma_disconnect (answer)");
	ev = expect(ch, RDMA_CM_EVENT_DISCONNECTED, 5000);
	CHECK(ev->id == child, "the disconnecting side too");
	CHECK(child->qp->state == IBV_QPS_ERR, "QP to ERR on disconnect (%d)",
	      child->qp->state);
	printf("ok disconnect\n");

	/* rdma_destroy_id waits for the event it reported. */
	{
		struct destroyer d = { .id = child, .done = 0 };
		pthread_t t;

		rdma_dereg_mr(rmr);
		rdma_destroy_qp(child);
		CHECK(pthread_create(&t, NULL, destroy_thread, &d) == 0, "pthread_create");
		usleep(200000);
		CHECK(!d.done, "rdma_destroy_id returned with an event unacknowledged");
		ack(ev);
		pthread_join(t, NULL);
		CHECK(d.done, "rdma_destroy_id returned after the ack");
	}
	printf("ok destroy waits for the ack\n");
	rdma_dereg_mr(smr);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0, "rdma_destroy_id");
	CHECK(rdma_destroy_id(l) == 0, "rdma_destroy_id");

	/* UD through SIDR. */
	l = listener(ch, port + 2, RDMA_PS_UDP, NULL);
	c = connector(ch, port + 2, RDMA_PS_UDP, 1);
	CHECK(rdma_connect(c, NULL) == 0, "rdma_connect (SIDR)");
	ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 5000);
	child = ev->id;
	ack(ev);
	memset(&qinit, 0, sizeof(qinit));
	qinit.qp_type = IBV_QPT_UD;
	qinit.cap.max_send_wr = qinit.cap.max_recv_wr = 8;
	qinit.cap.max_send_sge = qinit.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(child, NULL, &qinit) == 0, "rdma_create_qp (UD)");
	CHECK(child->qp->state == IBV_QPS_RTS, "a UD QP is ready at once");
	CHECK(rdma_accept(child, NULL) == 0, "rdma_accept (SIDR)");
	ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
	CHECK(ev->id == c && ev->param.ud.qp_num == child->qp->qp_num &&
		      ev->param.ud.qkey == RDMA_UDP_QKEY,
	      "SIDR_REP: qpn %u, qkey %#x", ev->param.ud.qp_num, ev->param.ud.qkey);
	ack(ev);
	printf("ok UD through SIDR\n");
	rdma_destroy_qp(child);
	CHECK(rdma_destroy_id(child) == 0, "rdma_destroy_id");
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0, "rdma_destroy_id");
	CHECK(rdma_destroy_id(l) == 0, "rdma_destroy_id");

	/* rdma_set_option: TOS and ACK timeout; a wrong length is EINVAL, an
	 * unknown option ENOSYS. */
	CHECK(rdma_create_id(ch, &bad, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	{
		uint8_t tos = 0x20, ack = 14;
		int four = 4;

		CHECK(rdma_set_option(bad, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0,
		      "TOS");
		CHECK(rdma_set_option(bad, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack, 1) == 0,
		      "ACK timeout");
		errno = 0;
		CHECK(rdma_set_option(bad, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &four, 4) == -1 &&
			      errno == EINVAL, "TOS of 4 bytes");
		errno = 0;
		CHECK(rdma_set_option(bad, RDMA_OPTION_ID, 99, &four, 4) == -1 && errno == ENOSYS,
		      "unknown option");
	}
	CHECK(rdma_destroy_id(bad) == 0, "rdma_destroy_id");
	printf("ok rdma_set_option\n");

	/* rdma_migrate_id: a queued event follows the id to its new channel;
	 * migrated to NULL, the id is synchronous (its event in id->event). */
	{
		struct rdma_event_channel *ch2 = rdma_create_event_channel();
		struct sockaddr_in dst = sin_of(addr, port);
		struct rdma_cm_id *m;

		CHECK(ch2, "rdma_create_event_channel");
		CHECK(rdma_create_id(ch, &m, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
		CHECK(rdma_resolve_addr(m, NULL, (struct sockaddr *)&dst, 2000) == 0,
		      "rdma_resolve_addr");
		CHECK(rdma_migrate_id(m, ch2) == 0 && m->channel == ch2, "rdma_migrate_id");
		ev = expect(ch2, RDMA_CM_EVENT_ADDR_RESOLVED, 2000);
		CHECK(ev->id == m, "the event moved with its id");
		ack(ev);
		CHECK(rdma_migrate_id(m, NULL) == 0, "rdma_migrate_id to synchronous");
		CHECK(rdma_resolve_route(m, 2000) == 0, "synchronous rdma_resolve_route");
		CHECK(m->event && m->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED,
		      "the synchronous id keeps its event");
		CHECK(rdma_destroy_id(m) == 0, "rdma_destroy_id");
		rdma_destroy_event_channel(ch2);
	}
	printf("ok rdma_migrate_id\n");

	/* rdma_create_srq: the id's QP uses it. */
	{
		struct ibv_srq_init_attr sattr;

		c = connector(ch, port, RDMA_PS_TCP, 0);
		memset(&sattr, 0, sizeof(sattr));
		sattr.attr.max_wr = 16;
		sattr.attr.max_sge = 1;
		CHECK(rdma_create_srq(c, NULL, &sattr) == 0 && c->srq, "rdma_create_srq");
		memset(&qinit, 0, sizeof(qinit));
		qinit.qp_type = IBV_QPT_RC;
		qinit.cap.max_send_wr = qinit.cap.max_recv_wr = 8;
		qinit.cap.max_send_sge = qinit.cap.max_recv_sge = 1;
		CHECK(rdma_create_qp(c, NULL, &qinit) == 0 && c->qp->srq == c->srq,
		      "rdma_create_qp on the id's SRQ");
		rdma_destroy_qp(c);
		rdma_destroy_srq(c);
		CHECK(c->srq == NULL, "rdma_destroy_srq");
		CHECK(rdma_destroy_id(c) == 0, "rdma_destroy_id");
	}
	printf("ok rdma_create_srq\n");

	/* Stale handles (perftest 4.5 reuses a destroyed id and destroys its
	 * channel twice after a rejected connect): refused, never a crash. */
	{
		struct rdma_event_channel *ch3 = rdma_create_event_channel();
		struct rdma_cm_id *stale;
		struct sockaddr_in dst = sin_of(addr, port);

		CHECK(ch3 != NULL, "rdma_create_event_channel");
		CHECK(rdma_create_id(ch3, &stale, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
		CHECK(rdma_destroy_id(stale) == 0, "rdma_destroy_id");
		errno = 0;
		CHECK(rdma_resolve_addr(stale, NULL, (struct sockaddr *)&dst, 100) == -1 &&
			      errno == EINVAL,
		      "rdma_resolve_addr on a destroyed id: -1 EINVAL");
		rdma_destroy_event_channel(ch3);
		errno = 0;
		rdma_destroy_event_channel(ch3);
		CHECK(errno == EINVAL, "a second rdma_destroy_event_channel: EINVAL");
	}
	printf("ok stale handles\n");

	rdma_destroy_event_channel(ch);
	printf("all ok\n");
	return 0;
}
